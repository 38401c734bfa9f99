"""A retrieval's verification state (kvcs-draft 5.4), driven with a real publication plan in
production order: the late re-check of Objects used before the manifest listed them, the
COSE manifest with and without producer keys, and withdrawing a block."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from peers_helpers import cache, plan

from relay.kvcs.cose import KeyStore
from relay.kvcs.plan import PlannedObject, PublicationPlan
from relay.peers.state import RetrievalState
from relay.peers.verification import ManifestRefused, ManifestVerifier, check_object

URL = "moqt://127.0.0.1:1/"


def replay(p: PublicationPlan, objects: list[PlannedObject],
           swap: dict[tuple[str, int, int], bytes]) -> RetrievalState:
    """Feed ``objects`` to a fresh retrieval as a relay would deliver them, with the payloads
    in ``swap`` (by track, Group, Object) substituted."""
    state = RetrievalState(p.descriptor, p.block_keys)
    state.use_publication(p.namespace, ManifestVerifier(p.namespace, p.descriptor))
    for o in objects:
        payload = swap.get((o.track, o.group, o.object_id), o.payload)
        if o.track == p.manifest_track:
            state.on_manifest(o.track, o.group, payload)
        else:
            state.on_object(URL, state.targets[0], o.track, o.group, o.object_id, payload)
    return state


def test_an_object_a_later_manifest_lists_differently_is_withdrawn() -> None:
    c = cache(blocks=2)
    p = plan(c)
    objects = p.objects()
    manifests = [o for o in objects if o.track == p.manifest_track]
    # The first version lists no digest, the last lists all: every data Object in between
    # is used unlisted and re-checked when the last version arrives.
    assert len(manifests) == 2 and objects[-1] is manifests[-1]
    victim = next(o for o in objects if o.track != p.manifest_track and o.group == 1)
    # A well-formed Object of another cache at the same place: it passes 3.5 and the first
    # manifest version (which does not list its Group yet).
    impostor = next(o for o in plan(cache(blocks=2, seed=2)).objects()
                    if (o.track, o.group, o.object_id) ==
                    (victim.track, victim.group, victim.object_id))
    assert impostor.payload != victim.payload
    first = ManifestVerifier(p.namespace, p.descriptor).accept(
        manifests[0].track, manifests[0].group, manifests[0].payload)
    assert first is not None
    _, listed = check_object(first, victim.track, victim.group, victim.object_id,
                             impostor.payload)
    assert not listed

    key = (victim.track, victim.group, victim.object_id)
    # another Object of the same layer fails 3.5 outright: the counts must add up
    broken = next(o for o in objects if o.track not in (p.manifest_track, victim.track)
                  and o.group == victim.group)
    bkey = (broken.track, broken.group, broken.object_id)
    state = replay(p, objects[:-1], {key: impostor.payload, bkey: b"not a KVCS object"})
    target = state.targets[0]
    assert target.reasm.has(*key)  # used on the strength of 3.5, pending the re-check
    assert state.layers[victim.group].verified == 3
    assert state.layers[victim.group].discarded == 1 and len(state.discard_reasons) == 1

    state.on_manifest(manifests[-1].track, manifests[-1].group, manifests[-1].payload)
    assert not target.reasm.has(*key)
    assert state.layers[victim.group].discarded == 2
    assert state.layers[victim.group].verified == 2
    assert state.discard_reasons[1:] == [
        f"{victim.track} {victim.group}/{victim.object_id}: digest not the listed one"]
    assert state.unlisted == {}
    assert victim.group not in state.usable_layers()
    # every other Object stays
    for o in objects:
        if o.track != p.manifest_track and (o.track, o.group, o.object_id) not in (key, bkey):
            assert target.reasm.has(o.track, o.group, o.object_id), o


def test_the_genuine_objects_pass_the_late_recheck() -> None:
    p = plan(cache(blocks=2))
    objects = p.objects()
    state = replay(p, objects, {})
    assert state.complete and state.discard_reasons == [] and state.unlisted == {}
    assert state.verifier is not None and state.verifier.signed is False
    assert state.verifier.kid is None
    # a version seen again (another relay, a retry) is not news
    last = objects[-1]
    assert state.verifier.accept(last.track, last.group, last.payload) is None
    assert all(s.discarded == 0 and s.verified == 4 for s in state.layers.values())
    assert sorted(state.usable_layers()) == list(range(p.descriptor.layers))


def _first_manifest(p: PublicationPlan) -> PlannedObject:
    return next(o for o in p.objects() if o.track == p.manifest_track)


def test_manifest_cose_without_keys_is_read_unless_authenticity_is_required() -> None:
    c = cache(blocks=2)
    p = plan(c, signer=(ed25519.Ed25519PrivateKey.generate(), b"ed"))
    m = _first_manifest(p)
    # no key store, authenticity not required: the payload is read, unverified
    for keys in (None, KeyStore()):
        v = ManifestVerifier(p.namespace, p.descriptor, keys=keys)
        assert v.accept(m.track, m.group, m.payload) is not None
        assert v.signed and v.kid is None
    # authenticity required and nothing to check it with: refused
    for keys in (None, KeyStore()):
        with pytest.raises(ManifestRefused, match="no producer keys"):
            ManifestVerifier(p.namespace, p.descriptor, keys=keys,
                             require_cose=True).accept(m.track, m.group, m.payload)
    # not COSE at all, with no keys to check it: refused as malformed, not read
    with pytest.raises(ManifestRefused, match="malformed"):
        ManifestVerifier(p.namespace, p.descriptor).accept(m.track, m.group, b"\x01\x02")
    # with the producer's key: verified, and the kid is the signer's
    assert p.signer is not None
    v = ManifestVerifier(p.namespace, p.descriptor,
                         keys=KeyStore({b"ed": p.signer[0].public_key()}), require_cose=True)
    assert v.accept(m.track, m.group, m.payload) is not None
    assert v.signed and v.kid == b"ed"


def test_forgetting_an_unknown_block_or_asking_for_one_is_harmless() -> None:
    p = plan(cache(blocks=2))
    objects = p.objects()
    data = [o for o in objects if o.track != p.manifest_track]
    state = replay(p, objects[:-1], {})
    reasm = state.targets[0].reasm
    o = data[0]
    assert reasm.has(o.track, o.group, o.object_id)
    # a layer not ready yet, a track this target does not hold: nothing to forget or find
    reasm.forget(o.track, o.group, o.object_id)
    reasm.forget(o.track, o.group, o.object_id)
    reasm.forget("k.zstd.s9", o.group, 0)
    assert not reasm.has(o.track, o.group, o.object_id)
    assert not reasm.has("k.zstd.s9", o.group, 0)


def test_a_version_rechecks_what_it_lists_whatever_the_arrival_order() -> None:
    # Streams overtake each other: layer 2 arrives before layers 0 and 1. The version that
    # lists layers 0-1 must re-check those even though older, still unlisted entries
    # (layer 2) come first.
    p = plan(cache(blocks=2), manifest_every=2)
    objects = p.objects()
    manifests = [o for o in objects if o.track == p.manifest_track]
    assert len(manifests) == 3
    data = [o for o in objects if o.track != p.manifest_track]
    by_layer = {g: [o for o in data if o.group == g] for g in range(4)}
    victim = by_layer[1][0]
    impostor = next(o for o in plan(cache(blocks=2, seed=2), manifest_every=2).objects()
                    if (o.track, o.group, o.object_id) ==
                    (victim.track, victim.group, victim.object_id))
    key = (victim.track, victim.group, victim.object_id)
    arrival = [manifests[0], *by_layer[2], *by_layer[0], *by_layer[1], manifests[1]]
    state = replay(p, arrival, {key: impostor.payload})
    assert not state.targets[0].reasm.has(*key)
    assert state.discard_reasons == [
        f"{victim.track} {victim.group}/{victim.object_id}: digest not the listed one"]
    # layer 2 is not listed yet: still held, still waiting for its re-check
    assert {k[2] for k in state.unlisted} == {2}
    assert all(state.targets[0].reasm.has(o.track, o.group, o.object_id) for o in by_layer[2])
