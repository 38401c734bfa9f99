"""A retrieval's verification state (kvcs-draft 5.4), driven with a real publication plan in
production order: the late re-check of Objects used before the manifest listed them, the
COSE manifest with and without producer keys, and withdrawing a block."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from peers_helpers import cache, plan

from relay.kvcs.cose import KeyStore
from relay.kvcs.errors import KvcsError
from relay.kvcs.plan import PlannedObject, PublicationPlan
from relay.peers.state import RetrievalState, choose_tracks
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
            segment = int(o.track.rsplit(".s", 1)[1])  # data tracks end in .s<segment>
            state.on_object(URL, state.targets[segment], o.track, o.group, o.object_id, payload)
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


def test_the_shortest_round_trip_is_kept() -> None:
    p = plan(cache(blocks=1))
    state = RetrievalState(p.descriptor, p.block_keys)
    assert state.rtt is None
    for seconds in (0.5, 0.2, 0.3, 0.2):
        state.note_rtt(seconds)
    assert state.rtt == 0.2


def test_the_fill_timeout_is_what_is_left_before_the_deadline() -> None:
    p = plan(cache(blocks=1))
    state = RetrievalState(p.descriptor, p.block_keys)
    assert state.remaining() is None and state.fill_timeout_ms() is None
    state.deadline = time.monotonic() - 1.0  # passed: nothing left, never negative
    assert state.remaining() == 0.0 and state.fill_timeout_ms() == 0
    state.deadline = time.monotonic() + 10.0
    left, fill = state.remaining(), state.fill_timeout_ms()
    assert left is not None and 9.0 < left <= 10.0
    assert fill is not None and 9000 < fill <= 10000


async def test_progress_wakes_a_waiter_and_calls_the_progress_hook() -> None:
    p = plan(cache(blocks=1))
    seen: list[RetrievalState] = []
    state = RetrievalState(p.descriptor, p.block_keys, on_progress=seen.append)
    # wait_progress is itself bounded (asyncio.wait_for inside)
    assert await state.wait_progress(0.01) is False  # nothing happened
    # awaited directly, the waiter holds the current event before bump() runs (a progress
    # made before anyone waits wakes no later waiter)
    asyncio.get_running_loop().call_soon(state.bump)
    assert await state.wait_progress(5) is True
    assert seen == [state]
    state.decide("retry", relay=URL)
    assert state.decisions[-1]["action"] == "retry" and state.decisions[-1]["relay"] == URL
    assert 0 <= state.decisions[-1]["t_ms"] <= state.elapsed_ms()


def test_tracks_fall_back_to_raw_then_to_any_offered_selection() -> None:
    p = plan(cache(blocks=1))
    entry = replay(p, [_first_manifest(p)], {}).targets[0].entry
    raw = ["k.raw.s0", "v.raw.s0"]
    assert entry.tracks == raw
    assert choose_tracks(entry, "raw", False) == raw
    assert replay(p, [_first_manifest(p)], {}).targets[0].tracks == raw
    both = dataclasses.replace(entry, tracks=["kv.raw.s0", *raw])
    assert choose_tracks(both, "raw", True) == ["kv.raw.s0"]  # the joint one, as asked
    zstd = dataclasses.replace(entry, tracks=["k.zstd.s0", "v.zstd.s0"])
    assert choose_tracks(zstd, "int8", True) == ["k.zstd.s0", "v.zstd.s0"]
    assert choose_tracks(entry, "zstd", True) == raw  # not offered: raw k+v
    joint = dataclasses.replace(entry, tracks=["kv.zstd.s0"])
    assert choose_tracks(joint, "raw", False) == ["kv.zstd.s0"]  # the one implemented one
    with pytest.raises(KvcsError, match="no selection"):
        choose_tracks(dataclasses.replace(entry, tracks=["k.raw.s0"]), "raw", False)


def test_an_index_record_vouches_for_blocks_whose_keys_differ() -> None:
    """Block Keys of another prompt: a segment is used only as far as a trusted index record
    vouches for it, and no later segment is looked for."""
    p = plan(cache(blocks=3), segment_blocks=[2, 1])
    other = plan(cache(blocks=3, seed=2)).block_keys
    manifest = next(o for o in reversed(p.objects()) if o.track == p.manifest_track)
    for trusted, blocks in ((None, []), (1, [1]), (5, [2, 1])):
        state = RetrievalState(p.descriptor, other, trusted_blocks=trusted)
        state.use_publication(p.namespace, ManifestVerifier(p.namespace, p.descriptor))
        state.on_manifest(manifest.track, manifest.group, manifest.payload)
        assert [t.blocks for t in state.targets.values()] == blocks
        assert state.reused_blocks() == sum(blocks)
        assert not state.wants_more_segments()


def test_layers_not_usable_are_zero_in_the_arrays() -> None:
    c = cache(blocks=2)
    p = plan(c)
    empty = RetrievalState(p.descriptor, p.block_keys)
    k, v = empty.arrays()
    assert k.shape == v.shape == (p.descriptor.layers, p.descriptor.kv_heads, 0,
                                  p.descriptor.head_dim)
    objects = p.objects()
    whole = replay(p, objects, {})
    assert whole.missing_layers() == [] and whole.reused_blocks() == 2
    assert [a.tobytes() for a in whole.arrays()] == [c.k.tobytes(), c.v.tobytes()]
    # layer 1 of one track never arrives: that layer is missing and zero in both arrays
    lost = next(o for o in objects if o.track != p.manifest_track and o.group == 1)
    partial = replay(p, [o for o in objects if o is not lost], {})
    assert partial.missing_layers() == [1] and not partial.complete
    k, v = partial.arrays()
    assert not k[1].any() and not v[1].any()
    assert k[0].tobytes() == c.k[0].tobytes() and v[2].tobytes() == c.v[2].tobytes()


def test_what_each_object_does_to_the_layer_statistics() -> None:
    """Beyond the blocks used, again, broken, genuine: each counted once, in its place; the
    tamper hook sees exactly what arrived; End of Track's Group is no layer."""
    p = plan(cache(blocks=2))
    objects = p.objects()
    seen: list[tuple[str, str, int, int, bytes]] = []

    def tamper(relay: str, track: str, group: int, obj: int, payload: bytes) -> bytes:
        seen.append((relay, track, group, obj, payload))
        return payload

    # another prompt, vouched for up to block 1: 1 of the segment's 2 blocks is used
    other_keys = plan(cache(blocks=2, seed=2)).block_keys
    state = RetrievalState(p.descriptor, other_keys, tamper=tamper, trusted_blocks=1)
    state.use_publication(p.namespace, ManifestVerifier(p.namespace, p.descriptor))
    new = state.on_manifest(objects[0].track, objects[0].group, objects[0].payload)
    assert new == [state.targets[0]] and state.targets[0].blocks == 1
    target = state.targets[0]
    data = [o for o in objects if o.track != p.manifest_track and o.group == 0]
    used = [o for o in data if o.object_id == 0]
    beyond = [o for o in data if o.object_id == 1]
    for o in [*used, *used, *used, *beyond, *beyond]:
        state.on_object(URL, target, o.track, o.group, o.object_id, o.payload)
    stats = state.layers[0]
    assert (stats.verified, stats.discarded, state.duplicates) == (len(used), 2 * len(beyond),
                                                                   2 * len(used))
    assert stats.bytes == sum(len(o.payload) for o in used)
    assert seen == [(URL, o.track, 0, 0, bytes(o.payload)) for o in used]
    broken = used[0]
    other = RetrievalState(p.descriptor, p.block_keys)
    other.use_publication(p.namespace, ManifestVerifier(p.namespace, p.descriptor))
    other.on_manifest(objects[0].track, objects[0].group, objects[0].payload)
    for i in range(52):
        other.on_object(URL, other.targets[0], broken.track, 0, 0, b"broken %d" % i)
    assert other.layers[0].discarded == 52 and len(other.discard_reasons) == 50
    assert all(r.startswith(f"{URL} {broken.track} 0/0: ") for r in other.discard_reasons)
    other.on_object(URL, other.targets[0], broken.track, p.descriptor.layers, 0, b"")
    assert p.descriptor.layers not in other.layers
    # every layer's Objects of the one block used: the retrieval is complete without block 1
    for o in objects:
        if o.track != p.manifest_track and o.object_id == 0 and o.group > 0:
            state.on_object(URL, target, o.track, o.group, o.object_id, o.payload)
    assert state.complete and state.missing_layers() == []


def test_objects_not_listed_yet_are_reported_only_when_listing_is_required() -> None:
    p = plan(cache(blocks=2), manifest_every=2)
    objects = p.objects()
    last = max(i for i, o in enumerate(objects) if o.track == p.manifest_track)
    for required in (False, True):
        state = replay(p, objects[:last], {})
        state.require_listed = required
        pending = sorted(state.unlisted)
        assert pending
        if required:
            assert state.unverified_layers() == {k[2] for k in pending}
            assert state.unverified_objects() == [f"s{s} {t} {g}/{o}" for s, t, g, o in pending]
            assert not state.complete
        else:
            assert state.unverified_layers() == set() and state.unverified_objects() == []
        usable = state.usable_layers()
        for g, ms in usable.items():
            ready = max(t.reasm.layer_ready_at[g] for t in state.targets.values())
            assert ms == (ready - state.t0) * 1000


def test_elapsed_time_and_decisions_are_in_milliseconds() -> None:
    p = plan(cache(blocks=1))
    state = RetrievalState(p.descriptor, p.block_keys, t0=time.monotonic() - 100.0)
    state.decide("give up")
    t_ms = state.decisions[-1]["t_ms"]
    assert 100_000 <= t_ms <= state.elapsed_ms() < 100_000 + 60_000
    assert abs(t_ms * 100 - round(t_ms * 100)) < 1e-6  # two decimals


def test_a_new_publication_starts_with_fresh_segment_flags() -> None:
    p = plan(cache(blocks=2))
    state = RetrievalState(p.descriptor, p.block_keys)
    state.manifest_final = state.stop_segments = True
    state.use_publication(p.namespace, ManifestVerifier(p.namespace, p.descriptor))
    assert state.wants_more_segments()


def test_segments_are_taken_in_order_as_far_as_the_prompt_matches() -> None:
    """Three segments: each new manifest version adds the next; a signed publication is read
    through its COSE track; the arrays join the segments along the token axis."""
    c = cache(blocks=3)
    p = plan(c, segment_blocks=[1, 1, 1],
             signer=(ed25519.Ed25519PrivateKey.generate(), b"ed"))
    state = replay(p, p.objects(), {})
    assert [t.entry.segment for t in state.targets.values()] == [0, 1, 2]
    assert all(t.pub_id == p.namespace.pub_id for t in state.targets.values())
    assert state.complete and state.reused_blocks() == 3 and state.verifier is not None
    assert state.verifier.signed
    k, v = state.arrays()
    assert k.dtype == c.k.dtype and [k.tobytes(), v.tobytes()] == [c.k.tobytes(), c.v.tobytes()]
    empty_k, empty_v = RetrievalState(p.descriptor, p.block_keys).arrays()
    assert empty_k.dtype == empty_v.dtype == c.k.dtype
    # a prompt that matches the first segment only, vouched for up to block 2
    other = plan(cache(blocks=3, seed=2)).block_keys
    uneven = plan(c, segment_blocks=[1, 2])
    for q, keys, trusted, blocks, latest_only in (
            (p, p.block_keys[:1], None, [1], False), (p, p.block_keys[:2], 5, [1, 1], False),
            (p, other, 2, [1, 1], False), (p, p.block_keys, None, [1, 1, 1], True),
            (uneven, other, 2, [1, 1], True)):
        partial = RetrievalState(q.descriptor, keys, trusted_blocks=trusted)
        partial.use_publication(q.namespace, ManifestVerifier(q.namespace, q.descriptor))
        versions = [o for o in q.objects() if o.track == q.manifest_track]
        new = [t for o in (versions[-1:] if latest_only else versions)
               for t in partial.on_manifest(o.track, o.group, o.payload)]
        assert new == list(partial.targets.values())  # each target returned once, when new
        assert [t.blocks for t in partial.targets.values()] == blocks


def test_a_second_publication_must_lay_out_its_segments_the_same_way() -> None:
    c = cache(blocks=2)
    first = plan(c)
    mine = next(o for o in first.objects() if o.track != first.manifest_track)
    state = replay(first, [*first.objects()[:1], mine], {})
    assert list(state.targets) == [0]
    same = plan(c)
    assert same.namespace.pub_id != first.namespace.pub_id
    state.use_publication(same.namespace, ManifestVerifier(same.namespace, same.descriptor))
    m = next(o for o in reversed(same.objects()) if o.track == same.manifest_track)
    assert state.on_manifest(m.track, m.group, m.payload) == []  # same blocks: kept
    # an Object of the other (not deterministic) publication in the first one's segment (5.4)
    o = next(o for o in same.objects() if o.track != same.manifest_track and o.group == 1)
    state.on_object(URL, state.targets[0], o.track, o.group, o.object_id, o.payload)
    assert state.layers[1].discarded == 1 and "another publication" in state.discard_reasons[0]
    other = plan(c, segment_blocks=[1, 1])
    state.use_publication(other.namespace, ManifestVerifier(other.namespace, other.descriptor))
    m = next(o for o in reversed(other.objects()) if o.track == other.manifest_track)
    with pytest.raises(KvcsError, match="covers other blocks"):
        state.on_manifest(m.track, m.group, m.payload)
