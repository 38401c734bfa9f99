"""The admin API (/admin/state, /admin/purge) of a real relay over real QUIC and LMDB: off
without a token, 401 and nothing changed with a wrong one, purge ends subscriptions and
namespaces and survives a restart; `kvcs admin` is a thin client of it."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path

import pytest
from admin_helpers import (
    TOKEN,
    abusive_requests,
    admin_relay,
    committed_track,
    http,
    purge,
    raw_http,
)
from test_ops_metrics import scrape, val

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from relay_helpers import (
    TIMEOUT,
    client,
    drain,
    fetch_objects,
    group_payloads,
    live_params,
    make_ns,
    push_track,
    relay_at,
    wait_cached,
)

from relay.config import load
from relay.moqt.codes import PublishDoneCode, RequestErrorCode
from relay.moqt.namespace_text import format_namespace
from relay.moqt.primitives import FullTrackName, Location
from relay.moqt.token import Token
from relay.service import RunningRelay
from relay.session import RequestRejected, SessionConfig

ROOT = Path(__file__).resolve().parents[2]


async def _fetch_refused(r: object, name: FullTrackName) -> int:
    s = await client(r)  # type: ignore[arg-type]
    try:
        await fetch_objects(s, name)
    except RequestRejected as e:
        return int(e.code)
    finally:
        await s.aclose()
    return -1


async def test_admin_is_off_without_a_token(tmp_path: Path) -> None:
    r = await admin_relay(tmp_path, token=None)
    try:
        assert r.metrics_port is not None
        assert (await http(r.metrics_port, "GET", "/admin/state"))[0] == 404
        assert (await purge(r.metrics_port, "kvcs-1"))[0] == 404
    finally:
        await r.close()


async def test_wrong_or_missing_token_is_401_changes_nothing_and_is_counted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    r = await admin_relay(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        port = r.metrics_port
        assert port is not None
        await committed_track(r, name)
        for token in (None, "", "wrong-token-0123456789abcdef", TOKEN[:-1], TOKEN + "x"):
            assert (await http(port, "GET", "/admin/state", token))[0] == 401
            assert (await purge(port, format_namespace(name.namespace), token))[0] == 401
        s = await client(r)
        _, objs = await fetch_objects(s, name)  # the refused purges removed nothing
        assert len(objs) == 6
        await s.aclose()
        assert val(await scrape(r), "kvcs_relay_admin_unauthorized_total") == 10
        assert val(await scrape(r), "kvcs_relay_admin_purged_tracks_total") == 0
        # the scheme matters too, not only the value
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET /admin/state HTTP/1.1\r\nAuthorization: Basic {TOKEN}\r\n\r\n"
                     .encode())
        assert (await asyncio.wait_for(reader.read(), TIMEOUT)).startswith(b"HTTP/1.1 401")
        writer.close()
        assert (await http(port, "GET", "/admin/state"))[0] == 200
    finally:
        await r.close()
    assert TOKEN not in caplog.text


async def test_state_says_a_track_whose_publisher_failed_is_aborted(tmp_path: Path) -> None:
    """An operator tells a publication cut short (never to reach LMDB) from a live one."""
    r = await admin_relay(tmp_path)
    name = FullTrackName(make_ns(), b"kv.raw.s0")
    key = (format_namespace(name.namespace), "kv.raw.s0")
    try:
        port = r.metrics_port
        assert port is not None
        pub = await client(r)
        live = await push_track(pub, name, layers=3)
        await live.group(0, group_payloads(0, 2))
        await wait_cached(r, name, Location(0, 1))

        async def entry() -> dict[str, object]:
            state = json.loads((await http(port, "GET", "/admin/state"))[1])
            return {(t["namespace"], t["name"]): t for t in state["tracks"]}[key]

        t = await entry()
        assert t["live"] and not t["aborted"] and not t["complete"]
        held = t["largest_object"]
        track = r.relay.tracks[name]
        await pub.aclose()  # the publisher goes before End of Track
        async with asyncio.timeout(TIMEOUT):
            while track.live:
                await track.wait_change(TIMEOUT)
        t = await entry()
        assert t["aborted"] and not t["live"] and not t["complete"]
        assert t["largest_object"] == held  # what it held is still served
    finally:
        await r.close()


async def test_state_then_purge_ends_subscriptions_and_namespaces_also_after_restart(
        tmp_path: Path) -> None:
    r = await admin_relay(tmp_path)
    ns_a, ns_b = make_ns(), make_ns()
    done_a = [FullTrackName(ns_a, b"k.raw.s0"), FullTrackName(ns_a, b"v.raw.s0")]
    live_a = FullTrackName(ns_a, b"kv.raw.s0")
    kept = FullTrackName(ns_b, b"k.raw.s0")
    text_a = format_namespace(ns_a)
    try:
        port = r.metrics_port
        assert port is not None
        for name in (*done_a, kept):
            await committed_track(r, name)
        watcher = await client(r)
        events = aiter(await asyncio.wait_for(watcher.subscribe_namespace((b"kvcs-1",)),
                                              TIMEOUT))
        pub = await client(r)
        live = await push_track(pub, live_a, layers=3)
        await live.group(0, group_payloads(0, 2))
        await wait_cached(r, live_a, Location(0, 1))
        sub_s = await client(r)
        sub = await asyncio.wait_for(sub_s.subscribe(ns_a, live_a.name, live_params()), TIMEOUT)
        collected = asyncio.ensure_future(drain(sub))

        code, text = await http(port, "GET", "/admin/state")
        assert code == 200
        state = json.loads(text)
        assert state["sessions"]["quic"] == 3 and state["sessions"]["total"] == 3
        assert {text_a, format_namespace(ns_b)} <= set(state["namespaces"])
        by_name = {(t["namespace"], t["name"]): t for t in state["tracks"]}
        t = by_name[(text_a, "k.raw.s0")]
        assert t["tiers"] == ["lmdb", "memory"] and t["complete"] and not t["live"]
        assert t["largest_object"] == [2, 0] and t["bytes"]["lmdb"] > 6 * 2000
        t = by_name[(text_a, "kv.raw.s0")]
        assert t["live"] and not t["complete"] and t["subscribers"] == 1
        assert t["tiers"] == ["memory"]
        assert {s["scope"] for s in state["scopes"]} == {ns_a[1].hex(), ns_b[1].hex()}

        code, doc = await purge(port, text_a)
        assert code == 200
        assert sorted(x["name"] for x in doc["removed"]) == ["k.raw.s0", "kv.raw.s0",
                                                            "v.raw.s0"]
        assert doc["subscriptions_ended"] == 1 and doc["namespaces_done"] == [text_a]
        # forgotten by name and by namespace alike (SUBSCRIBE_TRACKS offers from the latter)
        assert ns_a not in r.relay.tracks_by_namespace
        got = await asyncio.wait_for(collected, TIMEOUT)
        assert got.done is not None and got.done.status == PublishDoneCode.EXPIRED
        seen: list[tuple[tuple[bytes, ...], bool]] = []
        async with asyncio.timeout(TIMEOUT):
            while (ns_a, False) not in seen:
                ev = await anext(events)
                seen.append((ev.namespace, ev.active))
        for name in (*done_a, live_a):
            assert await _fetch_refused(r, name) == RequestErrorCode.DOES_NOT_EXIST
        s = await client(r)
        assert len((await fetch_objects(s, kept))[1]) == 6
        await s.aclose()
        assert val(await scrape(r), "kvcs_relay_admin_purged_tracks_total") == 3

        nothing = "kvcs-1/hex:" + os.urandom(32).hex()
        assert await purge(port, nothing) == (200, {
            "prefix": nothing, "removed": [], "subscriptions_ended": 0, "namespaces_done": []})
        for bad in (b"not json", b'{"prefix": 3}', b'{"prefix": "kvcs-1/hex:zz"}', b"{}",
                    b'{"prefix": ""}'):
            code, text = await http(port, "POST", "/admin/purge", body=bad)
            assert code == 400 and len(text.strip().splitlines()) == 1, (bad, text)
        for c in (watcher, pub, sub_s):
            await c.aclose()
    finally:
        await r.close()
    r2 = await admin_relay(tmp_path)
    try:
        assert await _fetch_refused(r2, done_a[0]) == RequestErrorCode.DOES_NOT_EXIST
        assert r2.metrics_port is not None
        state = json.loads((await http(r2.metrics_port, "GET", "/admin/state"))[1])
        assert {t["namespace"] for t in state["tracks"]} == {format_namespace(ns_b)}
        assert text_a not in state["namespaces"]
    finally:
        await r2.close()


async def _kvcs(*args: str) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "relay.cli", *args, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(p.communicate(), 30)
    assert p.returncode is not None
    return p.returncode, out.decode(), err.decode()


async def test_kvcs_admin_client(tmp_path: Path) -> None:
    r = await admin_relay(tmp_path / "relay")
    name = FullTrackName(make_ns(), b"k.raw.s0")
    good, bad = tmp_path / "admin.token", tmp_path / "wrong.token"
    good.write_text(TOKEN + "\n")
    bad.write_text("not-the-admin-token-at-all\n")
    try:
        await committed_track(r, name)
        url = f"http://127.0.0.1:{r.metrics_port}"
        code, out, err = await _kvcs("admin", "state", "--relay-admin", url,
                                     "--token-file", str(good))
        assert code == 0, err
        assert json.loads(out)["tracks"][0]["name"] == "k.raw.s0"
        code, out, err = await _kvcs("admin", "purge", "--relay-admin", url,
                                     "--token-file", str(bad), "--prefix", "kvcs-1")
        assert code == 3 and err.count("\n") == 1 and "401" in err
        code, out, err = await _kvcs("admin", "purge", "--relay-admin", url, "--token-file",
                                     str(good), "--prefix", format_namespace(name.namespace))
        assert code == 0, err
        assert [x["name"] for x in json.loads(out)["removed"]] == ["k.raw.s0"]
        code, out, err = await _kvcs("admin", "purge", "--relay-admin", url, "--token-file",
                                     str(good), "--prefix", "kvcs-1/hex:zz")
        assert code == 1 and err.startswith("error: ") and err.count("\n") == 1
        assert "Traceback" not in err
    finally:
        await r.close()


async def test_abusive_requests_get_a_clean_answer_no_traceback_and_are_counted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A Content-Length that str.isdigit() accepts and int() refuses, a body nested past
    the recursion limit, a 1 MB header: each is answered (400, 401, 431), none logs a
    traceback, and those without the token count as refused."""
    caplog.set_level(logging.DEBUG)
    r = await admin_relay(tmp_path)
    try:
        assert r.metrics_port is not None
        for what, request, status in abusive_requests():
            code, body = await raw_http(r.metrics_port, request)
            assert code == status, what
            assert len(body.strip().splitlines()) == 1, (what, body)
        assert val(await scrape(r), "kvcs_relay_admin_unauthorized_total") == 2
        assert (await http(r.metrics_port, "GET", "/admin/state"))[0] == 200  # still serving
    finally:
        await r.close()
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert "Traceback" not in caplog.text


async def _purge_refused_and_nothing_removed(r: RunningRelay, name: FullTrackName,
                                             status: int | None, body: bytes) -> None:
    assert status == 400, body
    assert len(body.strip().splitlines()) == 1, body
    s = await client(r)
    assert len((await fetch_objects(s, name))[1]) == 6  # every Object still served
    await s.aclose()
    assert val(await scrape(r), "kvcs_relay_admin_purged_tracks_total") == 0


async def test_purge_with_a_key_besides_prefix_is_400_and_removes_nothing(
        tmp_path: Path) -> None:
    """{"prefix": ..., "x": 1} is not a purge request: a client that meant something else
    by its extra key (a dry run, a filter) must not have the prefix purged."""
    r = await admin_relay(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        assert r.metrics_port is not None
        await committed_track(r, name)
        body = json.dumps({"prefix": format_namespace(name.namespace), "x": 1}).encode()
        code, text = await http(r.metrics_port, "POST", "/admin/purge", body=body)
        await _purge_refused_and_nothing_removed(r, name, code, text.encode())
    finally:
        await r.close()


async def test_a_body_over_64_KiB_is_400_without_being_read(tmp_path: Path) -> None:
    """Content-Length 65537 is refused from the header alone: the listener neither waits
    for the body (here never sent) nor reads one (here a valid purge request, padded)."""
    r = await admin_relay(tmp_path)
    name = FullTrackName(make_ns(), b"k.raw.s0")
    try:
        port = r.metrics_port
        assert port is not None
        await committed_track(r, name)
        head = (f"POST /admin/purge HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {TOKEN}\r\nContent-Length: 65537\r\n\r\n").encode()
        # no body at all, and our side ended: a listener that waited for it gets nothing
        code, text = await raw_http(port, head, eof=True)
        assert code == 400 and b"64 KiB" in text, text
        purge_doc = json.dumps({"prefix": format_namespace(name.namespace)}).encode()
        code, text = await raw_http(port, head + purge_doc.ljust(65537))
        await _purge_refused_and_nothing_removed(r, name, code, text)
    finally:
        await r.close()


async def test_purge_sibling_routes_takes_a_strict_body(tmp_path: Path) -> None:
    """The supervisor's second round of a purge (docs/workers.md), on a relay without
    siblings: nothing to forget; a body other than {"namespaces": [...]} is 400; without
    the token, 401 like every admin path."""
    r = await admin_relay(tmp_path)
    path = "/admin/purge-sibling-routes"
    try:
        port = r.metrics_port
        assert port is not None
        ok = json.dumps({"namespaces": ["kvcs-1/hex:00ff"]}).encode()
        code, text = await http(port, "POST", path, body=ok)
        assert code == 200 and json.loads(text) == {"routes_removed": 0, "namespaces_done": []}
        for bad in (b"{}", b'{"namespaces": "kvcs-1"}', b'{"namespaces": [3]}',
                    b'{"namespaces": [], "x": 1}', b'{"namespaces": ["kvcs-1/hex:zz"]}',
                    b"[" * 60_000):
            code, text = await http(port, "POST", path, body=bad)
            assert code == 400 and len(text.strip().splitlines()) == 1, (bad[:40], text)
        assert (await http(port, "GET", path))[0] == 405
        assert (await http(port, "POST", path, token=None, body=ok))[0] == 401
    finally:
        await r.close()


async def test_a_scope_copied_from_admin_state_into_a_tokens_file_authorizes_it(
        tmp_path: Path) -> None:
    """The namespace text the admin API prints is the one the token table reads: the
    operator's copy of a Track's scope prefix, pasted into ``[[auth.tokens]]``, grants it."""
    name, other = FullTrackName(make_ns(), b"k.raw.s0"), FullTrackName(make_ns(), b"k.raw.s0")
    r = await admin_relay(tmp_path / "open")
    try:
        pub = await client(r)
        t = await push_track(pub, name, layers=1)
        await t.group(0, group_payloads(0, 1))
        await wait_cached(r, name, Location(0, 0))
        assert r.metrics_port is not None
        state = json.loads((await http(r.metrics_port, "GET", "/admin/state"))[1])
        await pub.aclose()
    finally:
        await r.close()
    scope = "/".join(state["tracks"][0]["namespace"].split("/")[:2])  # kvcs-1/<scope>
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[[auth.tokens]]\ntoken = "tenant"\nprefixes = ["{scope}"]\n'
                      'roles = ["publish"]\n')
    conf = tmp_path / "relay.toml"
    conf.write_text(f'tokens_file = "{tokens}"\n')
    r = await relay_at(tmp_path / "auth", auth_tokens=load({}, {}, conf).auth_tokens)
    try:
        pub = await client(r, config=SessionConfig(
            authorization_tokens=(Token.use_value(b"tenant"),)))
        await asyncio.wait_for(pub.publish_namespace(name.namespace), TIMEOUT)
        with pytest.raises(RequestRejected) as e:
            await asyncio.wait_for(pub.publish_namespace(other.namespace), TIMEOUT)
        assert e.value.code == RequestErrorCode.UNAUTHORIZED
        await pub.aclose()
    finally:
        await r.close()
