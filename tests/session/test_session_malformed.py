"""Appendix B over real connections: a peer that breaks a rule is closed with the spec's code
within a bounded time, and the server keeps serving its other sessions.

Which rule decides what is tested on the sans-IO states in memory
(``tests/moqt/test_moqt_state.py``, ``test_moqt_reject.py``); here one case of each path by
which a decision reaches the network (a request stream, a unidirectional stream, the control
stream, a refused request, a REQUEST_UPDATE too many)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from session_helpers import TIMEOUT, TrackPublisher

from relay.moqt.codes import ParameterType, RequestErrorCode, SessionErrorCode
from relay.moqt.control import ControlStreamParser, encode_message
from relay.moqt.messages import (
    GoAway,
    RequestErrorMessage,
    RequestOk,
    RequestUpdate,
    Setup,
    Subscribe,
    SubscribeOk,
)
from relay.moqt.params import Params
from relay.moqt.primitives import FullTrackName
from relay.moqt.range_filter import Range, RangeFilter
from relay.session import MoqtSession, SessionConfig, open_session
from relay.session.wire import MOQT
from relay.transport import (
    Connection,
    Server,
    TransportError,
    connect,
    ensure_self_signed,
    serve,
)

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

    srv = await serve("127.0.0.1", 0, certs / "cert.pem", certs / "key.pem", on_conn,
                      application=MOQT)
    yield srv
    await srv.close()


async def _raw(server: Server, certs: Path) -> Connection:
    conn = await asyncio.wait_for(connect(f"moqt://127.0.0.1:{server.port}/",
                                          ca_file=certs / "cert.pem", application=MOQT), TIMEOUT)
    ctl = await conn.open_uni()
    await ctl.write(SETUP)
    return conn


def sub(rid: int, params: Params = Params()) -> bytes:  # noqa: B008
    return encode_message(Subscribe(rid, NS, TRACK.name, params))


# (case, bytes on one new bidi stream / uni stream, expected Session Termination code)
BIDI_CASES = [
    ("response as the first message", encode_message(SubscribeOk(1)), PV),  # the state
    ("wrong Request ID parity", sub(1), SessionErrorCode.INVALID_REQUEST_ID),  # the state
    ("Length shorter than the body", b"\x03\x00\x02\x00\x01\x05", PV),  # the codec
]
UNI_CASES = [
    ("a second control stream", SETUP, PV),
    ("FIN inside the stream type", b"\xc0\x00", PV),
]


@pytest.mark.parametrize(("case", "data", "code"), BIDI_CASES, ids=[c[0] for c in BIDI_CASES])
async def test_bad_request_streams_close_the_session(server: Server, certs: Path, case: str,
                                                     data: bytes, code: int) -> None:
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
                                          ca_file=certs / "cert.pem", application=MOQT), TIMEOUT)
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


async def test_request_updates_beyond_max_request_updates_close_the_session(
        server: Server, certs: Path) -> None:
    """MAX_REQUEST_UPDATES (the server's default, 4) bounds the unanswered REQUEST_UPDATEs
    on one request stream; the fifth closes the session with TOO_MANY_REQUEST_UPDATES
    (§4.2, 0x1B) rather than being answered."""
    conn = await _raw(server, certs)
    send, recv = await conn.open_bi()
    updates = b"".join(encode_message(RequestUpdate(rid)) for rid in range(2, 12, 2))
    await send.write(sub(0) + updates)  # one write: all five arrive before any reply
    parser = ControlStreamParser()
    replies: list[object] = []
    async with asyncio.timeout(TIMEOUT):
        with contextlib.suppress(TransportError):  # the session closes under the read
            while sum(isinstance(m, RequestOk) for m in replies) < 5 and \
                    (chunk := await recv.read()):
                replies += parser.feed(chunk)
        assert sum(isinstance(m, RequestOk) for m in replies) < 5, "every update answered"
        code, _ = await conn.wait_closed()
    assert code == SessionErrorCode.TOO_MANY_REQUEST_UPDATES
    await _still_serving(server, certs)


async def _still_serving(server: Server, certs: Path) -> None:
    good = await asyncio.wait_for(open_session(f"moqt://127.0.0.1:{server.port}/",
                                               ca_file=certs / "cert.pem"), TIMEOUT)
    try:
        s = await asyncio.wait_for(good.subscribe(NS, TRACK.name), TIMEOUT)
        assert s.track_alias is not None
    finally:
        await good.aclose()
