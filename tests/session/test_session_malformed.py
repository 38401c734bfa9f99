"""Appendix B over real connections: a peer that breaks a rule is closed with the spec's code
within a bounded time, and the server keeps serving its other sessions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from session_helpers import TIMEOUT, TrackPublisher

from relay.moqt.codes import ParameterType, RequestErrorCode, SessionErrorCode
from relay.moqt.control import ControlStreamParser, encode_message
from relay.moqt.messages import GoAway, RequestErrorMessage, Setup, Subscribe, SubscribeOk
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName
from relay.moqt.range_filter import Range, RangeFilter
from relay.session import MoqtSession, SessionConfig, open_session
from relay.transport import Connection, Server, connect, ensure_self_signed, serve

NS = (b"kvcs-1", b"malformed")
TRACK = FullTrackName(NS, b"k.raw.s0")
SETUP = encode_message(Setup(max_filter_ranges=0))
PV = SessionErrorCode.PROTOCOL_VIOLATION


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_self_signed(tmp_path_factory.mktemp("tls")).certfile.parent


@pytest.fixture
async def server(certs: Path) -> AsyncIterator[Server]:
    async def on_conn(conn: Connection) -> None:
        # the server advertises MAX_FILTER_RANGES 0: any Range filter is INVALID_FILTER
        s = await MoqtSession.start(conn, SessionConfig(max_filter_ranges=0),
                                    TrackPublisher(TRACK))
        await s.wait_closed()

    srv = await serve("127.0.0.1", 0, certs / "cert.pem", certs / "key.pem", on_conn)
    yield srv
    await srv.close()


async def _raw(server: Server, certs: Path) -> Connection:
    conn = await asyncio.wait_for(connect(f"moqt://127.0.0.1:{server.port}/",
                                          ca_file=certs / "cert.pem"), TIMEOUT)
    ctl = await conn.open_uni()
    await ctl.write(SETUP)
    return conn


def sub(rid: int, params: Params = Params()) -> bytes:  # noqa: B008
    return encode_message(Subscribe(rid, NS, TRACK.name, params))


# (case, bytes on one new bidi stream / uni stream, expected Session Termination code)
BIDI_CASES = [
    ("response as the first message", encode_message(SubscribeOk(1)), PV),
    ("wrong Request ID parity", sub(1), SessionErrorCode.INVALID_REQUEST_ID),
    ("unknown message type", b"\x3f\x00\x00", PV),
    ("Length shorter than the body", b"\x03\x00\x02\x00\x01\x05", PV),
    ("unknown parameter", sub(0)[:-1] + b"\x01\x2f\x00", PV),
    ("namespace with 33 fields",
     b"\x03\x00\x24\x00\x21" + b"\x01a" * 33 + b"\x00\x00", PV),
    ("FORWARD value 2", sub(0)[:-1] + b"\x01\x10\x02", PV),
]
UNI_CASES = [
    ("a second control stream", SETUP, PV),
    ("unknown unidirectional stream type", b"\x40\x7f", PV),
    ("SUBGROUP_HEADER with Subgroup ID mode 0b11", b"\x16\x01\x00", PV),
    ("FIN inside the stream type", b"\xc0\x00", PV),
]


def _fix_length(msg: bytes) -> bytes:
    """Re-frame a hand-edited one-message buffer (type 1 byte, 16-bit length)."""
    return msg[:1] + (len(msg) - 3).to_bytes(2, "big") + msg[3:]


@pytest.mark.parametrize(("case", "data", "code"), BIDI_CASES, ids=[c[0] for c in BIDI_CASES])
async def test_bad_request_streams_close_the_session(server: Server, certs: Path, case: str,
                                                     data: bytes, code: int) -> None:
    if case in ("unknown parameter", "namespace with 33 fields", "FORWARD value 2"):
        data = _fix_length(data)
    conn = await _raw(server, certs)
    send, _ = await conn.open_bi()
    await send.write(data)
    got, _ = await asyncio.wait_for(conn.wait_closed(), TIMEOUT)
    assert got == code
    await _still_serving(server, certs)


@pytest.mark.parametrize(("case", "data", "code"), UNI_CASES, ids=[c[0] for c in UNI_CASES])
async def test_bad_unidirectional_streams_close_the_session(server: Server, certs: Path,
                                                            case: str, data: bytes,
                                                            code: int) -> None:
    conn = await _raw(server, certs)
    s = await conn.open_uni()
    await s.write(data, end_stream=True)
    got, _ = await asyncio.wait_for(conn.wait_closed(), TIMEOUT)
    assert got == code
    await _still_serving(server, certs)


async def test_duplicate_request_id_and_second_goaway(server: Server, certs: Path) -> None:
    conn = await _raw(server, certs)
    for _ in range(2):
        send, _ = await conn.open_bi()
        await send.write(sub(0))
    got, _ = await asyncio.wait_for(conn.wait_closed(), TIMEOUT)
    assert got == SessionErrorCode.INVALID_REQUEST_ID

    conn = await asyncio.wait_for(connect(f"moqt://127.0.0.1:{server.port}/",
                                          ca_file=certs / "cert.pem"), TIMEOUT)
    ctl = await conn.open_uni()
    await ctl.write(SETUP + encode_message(GoAway()) + encode_message(GoAway()))
    got, _ = await asyncio.wait_for(conn.wait_closed(), TIMEOUT)
    assert got == PV


async def test_range_filter_beyond_max_filter_ranges_is_a_request_error(
        server: Server, certs: Path) -> None:
    conn = await _raw(server, certs)
    send, recv = await conn.open_bi()
    f = RangeFilter(ParameterType.OBJECTID_FILTER, 0, (Range(0, 3),))
    await send.write(sub(0, Params(range_filters=(f,))))
    parser = ControlStreamParser()
    msgs: list[object] = []
    async with asyncio.timeout(TIMEOUT):
        while not msgs:
            msgs += parser.feed(await recv.read())
    assert isinstance(msgs[0], RequestErrorMessage)
    assert msgs[0].error_code == RequestErrorCode.INVALID_FILTER
    assert not conn.closed  # a request error, not a session error
    await conn.aclose()


async def _still_serving(server: Server, certs: Path) -> None:
    good = await asyncio.wait_for(open_session(f"moqt://127.0.0.1:{server.port}/",
                                               ca_file=certs / "cert.pem"), TIMEOUT)
    try:
        s = await asyncio.wait_for(good.subscribe(NS, TRACK.name), TIMEOUT)
        assert s.track_alias is not None
    finally:
        await good.aclose()
