"""Authorization per scope (kvcs-draft 3.1, docs/relay.md): every request type is refused
without a token, with a wrong one, with another scope's, or with the wrong role; and a
SUBSCRIBE_NAMESPACE answer never reveals a namespace of a scope the subscriber may not read."""

from __future__ import annotations

import asyncio
import os
import textwrap
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from relay_helpers import (
    TIMEOUT,
    PushedTrack,
    client,
    fetch_objects,
    group_payloads,
    relay_at,
    wait_cached,
)

from relay.core.auth import Authorizer, Role
from relay.moqt.codes import RequestErrorCode
from relay.moqt.namespace_text import parse_namespace
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName, Location, TrackNamespace
from relay.moqt.token import Token
from relay.service import RunningRelay
from relay.session import MoqtSession, NamespaceSubscription, RequestRejected, SessionConfig

SCOPE_A, SCOPE_B = os.urandom(32), os.urandom(32)
TOKENS: list[dict[str, object]] = [
    {"token": f"{role}-{tag}", "prefixes": [f"kvcs-1/hex:{scope.hex()}"], "roles": [role]}
    for tag, scope in (("a", SCOPE_A), ("b", SCOPE_B)) for role in ("publish", "subscribe")
]


def ns_in(scope: bytes, pub: bytes = b"p" * 16) -> TrackNamespace:
    return (b"kvcs-1", scope, b"c" * 32, b"a" * 32, pub)


def tok(value: str | None) -> Params:
    """Params carrying one AUTHORIZATION_TOKEN, or none at all."""
    if value is None:
        return Params()
    return Params(authorization_tokens=(Token.use_value(value.encode()),))


async def publish_in(session: MoqtSession, name: FullTrackName, token: str) -> PushedTrack:
    """PUBLISH_NAMESPACE and PUBLISH with ``token``; the Track's Group 0 is written."""
    await asyncio.wait_for(session.publish_namespace(name.namespace, tok(token)), TIMEOUT)
    served = await asyncio.wait_for(session.publish(name.namespace, name.name, tok(token)),
                                    TIMEOUT)
    track = PushedTrack(session, served, name, layers=2)
    await track.group(0, group_payloads(0, 2, size=100))
    return track


async def refused(request: Awaitable[object]) -> None:
    """The request ends in REQUEST_ERROR UNAUTHORIZED, not in any other answer."""
    with pytest.raises(RequestRejected) as info:
        await asyncio.wait_for(request, TIMEOUT)
    assert info.value.code == RequestErrorCode.UNAUTHORIZED, info.value


@pytest.fixture
async def relay(tmp_path: Path) -> AsyncIterator[RunningRelay]:
    r = await relay_at(tmp_path, auth_tokens=TOKENS)
    try:
        yield r
    finally:
        await r.close()


# Tokens that must not open scope A for subscribing: none, unknown, scope B's, publish role.
NOT_SUBSCRIBE_A = (None, "nope", "subscribe-b", "publish-a")
NOT_PUBLISH_A = (None, "nope", "publish-b", "subscribe-a")


async def test_every_request_type_needs_a_token_of_its_scope_and_role(
        relay: RunningRelay) -> None:
    name = FullTrackName(ns_in(SCOPE_A), b"k.raw.s0")
    pub = await client(relay)
    await publish_in(pub, name, "publish-a")
    await wait_cached(relay, name, Location(0, 2))
    ns, track = name.namespace, name.name
    requests: dict[str, Callable[[MoqtSession, Params], Awaitable[object]]] = {
        "SUBSCRIBE": lambda s, p: s.subscribe(ns, track, p),
        "FETCH": lambda s, p: s.fetch(ns, track, p),
        "TRACK_STATUS": lambda s, p: s.track_status(ns, track, p),
        "SUBSCRIBE_NAMESPACE": lambda s, p: s.subscribe_namespace(ns[:2], p),
    }
    publishes: dict[str, Callable[[MoqtSession, Params], Awaitable[object]]] = {
        "PUBLISH_NAMESPACE": lambda s, p: s.publish_namespace(ns_in(SCOPE_A, b"q" * 16), p),
        "PUBLISH": lambda s, p: s.publish(ns, b"v.raw.s0", p),
    }
    failures = relay.relay.counters.auth_failures
    # One session per request: a refusal must not depend on what the session asked before.
    for send in requests.values():
        for value in NOT_SUBSCRIBE_A:
            await refused(send(await client(relay), tok(value)))
    for send in publishes.values():
        for value in NOT_PUBLISH_A:
            await refused(send(await client(relay), tok(value)))
    assert relay.relay.counters.auth_failures - failures == \
        len(requests) * len(NOT_SUBSCRIBE_A) + len(publishes) * len(NOT_PUBLISH_A)

    # The same requests with the right token are answered: the refusals above were about
    # the token, nothing else.
    sub = await client(relay)
    _resp, got = await fetch_objects(sub, name, tok("subscribe-a"))
    assert set(got) == {Location(0, 0), Location(0, 1)}
    status = await asyncio.wait_for(sub.track_status(ns, track, tok("subscribe-a")), TIMEOUT)
    assert status.params.largest_object == Location(0, 2)
    live = await asyncio.wait_for(sub.subscribe(ns, track, tok("subscribe-a")), TIMEOUT)
    assert live.largest == Location(0, 2)
    await asyncio.wait_for(sub.subscribe_namespace(ns[:2], tok("subscribe-a")), TIMEOUT)
    other = await client(relay)
    await asyncio.wait_for(other.publish(ns, b"v.raw.s0", tok("publish-a")), TIMEOUT)


async def test_a_setup_token_authorizes_every_request_of_its_session(
        relay: RunningRelay) -> None:
    name = FullTrackName(ns_in(SCOPE_A), b"k.raw.s0")
    await publish_in(await client(relay), name, "publish-a")
    await wait_cached(relay, name, Location(0, 2))
    ns, track = name.namespace, name.name
    setup_b = SessionConfig(authorization_tokens=(Token.use_value(b"subscribe-b"),))
    setup_a = SessionConfig(authorization_tokens=(Token.use_value(b"subscribe-a"),))
    for other in (setup_b, setup_a):  # A's token for subscribing does not publish either
        await refused((await client(relay, config=other)).publish(ns, b"v.raw.s0"))
    b = await client(relay, config=setup_b)
    for request in (b.fetch(ns, track), b.subscribe(ns, track), b.track_status(ns, track),
                    b.subscribe_namespace(ns[:2])):
        await refused(request)
    a = await client(relay, config=setup_a)
    _resp, got = await fetch_objects(a, name)
    assert set(got) == {Location(0, 0), Location(0, 1)}
    assert (await asyncio.wait_for(a.subscribe(ns, track), TIMEOUT)).largest == Location(0, 2)
    status = await asyncio.wait_for(a.track_status(ns, track), TIMEOUT)
    assert status.params.largest_object == Location(0, 2)
    # the SETUP token also decides what a namespace answer reveals
    nsub = await asyncio.wait_for(a.subscribe_namespace(ns[:2]), TIMEOUT)
    assert await seen_until(nsub, {ns}) == {ns}


async def seen_until(nsub: NamespaceSubscription, wanted: set[TrackNamespace]
                     ) -> set[TrackNamespace]:
    """Every namespace announced until all of ``wanted`` were (NAMESPACE only, in order)."""
    seen: set[TrackNamespace] = set()
    async with asyncio.timeout(TIMEOUT):
        async for ev in nsub:
            if ev.active:
                seen.add(ev.namespace)
            if wanted <= seen:
                return seen
    raise AssertionError(f"namespace subscription ended having seen {seen}")


@pytest.mark.parametrize("prefix", [(), (b"kvcs-1",)], ids=["empty", "kvcs-1"])
async def test_namespace_answers_hide_other_scopes(relay: RunningRelay,
                                                   prefix: TrackNamespace) -> None:
    pub_a, pub_b = await client(relay), await client(relay)
    # Scope B's namespaces exist (their publisher holds B's token) before and after the
    # subscriber arrives; each A namespace is announced after the B one before it, so by
    # the time the last A namespace arrives a leaked B namespace would have arrived too.
    early_b, late_b = ns_in(SCOPE_B, b"1" * 16), ns_in(SCOPE_B, b"2" * 16)
    early_a, late_a = ns_in(SCOPE_A, b"1" * 16), ns_in(SCOPE_A, b"2" * 16)
    await asyncio.wait_for(pub_b.publish_namespace(early_b, tok("publish-b")), TIMEOUT)
    await asyncio.wait_for(pub_a.publish_namespace(early_a, tok("publish-a")), TIMEOUT)
    sub = await client(relay)
    nsub = await asyncio.wait_for(sub.subscribe_namespace(prefix, tok("subscribe-a")), TIMEOUT)
    await asyncio.wait_for(pub_b.publish_namespace(late_b, tok("publish-b")), TIMEOUT)
    await asyncio.wait_for(pub_a.publish_namespace(late_a, tok("publish-a")), TIMEOUT)
    assert await seen_until(nsub, {early_a, late_a}) == {early_a, late_a}
    # B's own subscriber does hear of B's namespaces: they were there to be hidden.
    nsub_b = await asyncio.wait_for(
        (await client(relay)).subscribe_namespace(prefix, tok("subscribe-b")), TIMEOUT)
    assert await seen_until(nsub_b, {early_b, late_b}) == {early_b, late_b}


def test_config_prefixes_ignore_empty_fields_and_missing_keys_grant_nothing() -> None:
    # A leading, doubled or trailing "/" must not shorten a prefix (an empty prefix would
    # open every scope).
    assert parse_namespace(f"/kvcs-1//hex:{SCOPE_A.hex()}/") == (b"kvcs-1", SCOPE_A)
    auth = Authorizer.from_config([
        {"token": "slashes", "prefixes": [f"/kvcs-1//hex:{SCOPE_A.hex()}"],
         "roles": ["subscribe"]},
        {"token": "no-prefixes", "roles": ["subscribe", "publish"]},
        {"token": "no-roles", "prefixes": ["kvcs-1"]},
    ])
    assert auth.allows(Role.SUBSCRIBE, ns_in(SCOPE_A), [b"slashes"])
    assert not auth.allows(Role.SUBSCRIBE, ns_in(SCOPE_B), [b"slashes"])
    for role in Role:
        for token in (b"no-prefixes", b"no-roles"):
            assert not auth.allows(role, ns_in(SCOPE_A), [token])
            assert not auth.allows_prefix(role, (b"kvcs-1",), [token])


def test_the_module_docstring_example_grants_what_it_says() -> None:
    """relay/core/auth.py's configuration example, read as TOML, grants its token both roles
    on the scope ("kvcs-1", 0x00ff) and nothing on the text scope "00ff"."""
    import relay.core.auth as auth

    doc = auth.__doc__ or ""
    block = doc.split("::\n", 1)[1].split("\n\n")[0]
    entries = tomllib.loads(textwrap.dedent(block))["auth"]["tokens"]
    a = Authorizer.from_config(entries)
    for role in Role:
        assert a.allows(role, (b"kvcs-1", b"\x00\xff", b"c" * 32), [b"s3cret"])
        assert not a.allows(role, (b"kvcs-1", b"00ff", b"c" * 32), [b"s3cret"])
        assert not a.allows(role, (b"kvcs-1", b"\x00\xff"), [b"other"])
