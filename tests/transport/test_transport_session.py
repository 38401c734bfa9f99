"""Session lifecycle: close codes, refusals, TLS, timeouts, server shutdown."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from pathlib import Path

import pytest
from aioquic.asyncio import connect as aioquic_connect
from aioquic.quic.configuration import QuicConfiguration
from conftest import SETTINGS, Harness, url_for, w
from stream_helpers import read_all

from relay.session.wire import MOQT
from relay.transport import (
    ConnectionClosed,
    ConnectTimeout,
    QuicSettings,
    TransportError,
    connect,
    ensure_self_signed,
    fingerprint,
    serve,
)
from relay.transport.backend import get_backend


@pytest.mark.parametrize("closer", ["client", "server"])
async def test_close_code_and_reason_reach_the_peer(harness: Harness, transport: str,
                                                    closer: str) -> None:
    client, server = await harness.pair(transport)
    active, passive = (client, server) if closer == "client" else (server, client)
    pending_accept = asyncio.ensure_future(passive.accept())
    s, r = await w(passive.open_bi())
    await w(s.write(b"unfinished"))
    active.close(0x3, "protocol violation: test")
    assert await w(active.wait_closed()) == (0x3, "protocol violation: test")
    assert await w(passive.wait_closed()) == (0x3, "protocol violation: test")
    info = passive.streams.close_exc
    assert info is not None and info.application
    with pytest.raises(ConnectionClosed) as e:
        await w(pending_accept)
    assert e.value.code == 0x3
    with pytest.raises(ConnectionClosed):
        await w(r.read())
    with pytest.raises(ConnectionClosed):
        await w(s.write(b"more"))
    with pytest.raises(ConnectionClosed):
        await w(passive.open_uni())
    await w(client.aclose())


async def test_data_before_close_is_still_readable(pair: tuple) -> None:
    client, server = pair
    s = await w(client.open_uni())
    await w(s.write(b"last words", end_stream=True))
    inc = await w(server.accept())
    assert await w(read_all(inc.recv)) == b"last words"
    client.close(0, "done")
    assert await w(server.wait_closed()) == (0, "done")


async def test_server_close_all_sends_code(harness: Harness, transport: str) -> None:
    client, _server = await harness.pair(transport)
    await w(harness.server.close_all(0x10, "going away"))
    assert await w(client.wait_closed()) == (0x10, "going away")
    assert all(c.closed for c in harness.server._connections)


async def test_handler_return_closes_with_no_error(certs: object, transport: str) -> None:
    from relay.transport import serve

    async def handler(conn: object) -> None:
        return None

    server = await serve("127.0.0.1", 0, certs.certfile, certs.keyfile, handler,  # type: ignore[attr-defined]
                         settings=SETTINGS, application=MOQT)
    try:
        client = await w(connect(url_for(server, transport), settings=SETTINGS,
                                 ca_file=certs.certfile, application=MOQT))  # type: ignore[attr-defined]
        assert await w(client.wait_closed()) == (0, "")
        await w(client.aclose())
    finally:
        await w(server.close(grace=0.2))


async def test_unknown_webtransport_path_is_refused(harness: Harness) -> None:
    with pytest.raises(TransportError, match="404"):
        await w(connect(url_for(harness.server, "webtransport", "/elsewhere"),
                        settings=SETTINGS, ca_file=harness.certs.certfile, application=MOQT))


async def test_wrong_alpn_is_refused(harness: Harness) -> None:
    config = QuicConfiguration(is_client=True, alpn_protocols=["moqt-17"])
    config.load_verify_locations(cafile=str(harness.certs.certfile))
    config.server_name = "localhost"
    with pytest.raises(ConnectionError):
        async with aioquic_connect("127.0.0.1", harness.server.port, configuration=config):
            ...  # the handshake itself must fail


async def test_tls_verification(harness: Harness, tmp_path: Path,
                                caplog: pytest.LogCaptureFixture) -> None:
    url = url_for(harness.server, "quic")
    # the right CA, addressed by name and by IP (SANs cover both)
    for name in ("localhost", None):
        conn = await w(connect(url, settings=SETTINGS, ca_file=harness.certs.certfile,
                               server_name=name, application=MOQT))
        await w(conn.aclose())
    # another self-signed cert as CA: verification fails
    other = ensure_self_signed(tmp_path / "other")
    with pytest.raises(ConnectionClosed) as e:
        await w(connect(url, settings=SETTINGS, ca_file=other.certfile, application=MOQT))
    assert not e.value.application
    # insecure skips verification, loudly
    with caplog.at_level(logging.WARNING, logger="relay.transport.client"):
        conn = await w(connect(url, settings=SETTINGS, insecure=True, application=MOQT))
    assert "DISABLED" in caplog.text
    await w(conn.aclose())


def test_self_signed_certificate_is_stable(tmp_path: Path) -> None:
    first = ensure_self_signed(tmp_path)
    again = ensure_self_signed(tmp_path)
    assert first == again
    assert first.fingerprint == fingerprint(first.certfile)
    assert len(first.fingerprint) == 64
    assert oct(first.keyfile.stat().st_mode & 0o777) == "0o600"
    from cryptography import x509
    cert = x509.load_pem_x509_certificate(first.certfile.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert {str(a) for a in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    # usable by the stdlib TLS stack too (PEM key + cert match)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(first.certfile, first.keyfile)


async def test_connect_timeout(tmp_path: Path) -> None:
    # a UDP socket that never answers
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    try:
        port = sock.getsockname()[1]
        settings = QuicSettings(connect_timeout=0.3)
        with pytest.raises(ConnectTimeout):
            await w(connect(f"moqt://127.0.0.1:{port}/", settings=settings, insecure=True,
                            application=MOQT))
    finally:
        sock.close()


def test_settings_validation() -> None:
    with pytest.raises(ValueError):
        QuicSettings(max_datagram_size=60000)  # aioquic cannot encode >16383-byte frames
    with pytest.raises(ValueError):
        QuicSettings(max_datagram_size=1000)
    for bad in ("1500", "Auto", True, 1200.0):
        with pytest.raises(ValueError):
            QuicSettings(max_datagram_size=bad)  # type: ignore[arg-type]
    assert QuicSettings().max_datagram_size == "auto"
    with pytest.raises(ValueError):
        QuicSettings(backend="picoquic")
    for name in ("aioquic", "qh3"):
        cfg = get_backend(name).configuration(QuicSettings(max_datagram_size=8952), False,
                                              ["moqt-22"], 8952)
        assert cfg.max_datagram_frame_size == 65536
        assert cfg.max_datagram_size == 8952


async def test_bad_scheme() -> None:
    with pytest.raises(ValueError):
        await w(connect("http://127.0.0.1:1/", application=MOQT))


async def test_webtransport_without_moqt_offer_is_refused(harness: Harness,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import relay.transport.webtransport as webtransport_mod
    monkeypatch.setattr(webtransport_mod, "sf_string", lambda _: b'"moqt-99"')  # client offer
    with pytest.raises(TransportError, match="400"):
        await w(connect(url_for(harness.server, "webtransport"), settings=SETTINGS,
                        ca_file=harness.certs.certfile, application=MOQT))


async def test_webtransport_server_must_select_moqt(harness: Harness,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from relay.transport import ProtocolNegotiationError
    from relay.transport.webtransport import WebTransport

    def accept_without_protocol(self: WebTransport, sid: int, headers: object) -> None:
        self.h3.send_headers(sid, [(b":status", b"200")])
        self._host.transmit()

    monkeypatch.setattr(WebTransport, "_on_connect_request", accept_without_protocol)
    with pytest.raises(ProtocolNegotiationError):
        await w(connect(url_for(harness.server, "webtransport"), settings=SETTINGS,
                        ca_file=harness.certs.certfile, application=MOQT))


def _ca_and_leaf(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA certificate, and a server certificate + key it signed (SANs: localhost, 127.0.0.1)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvcs test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                       crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = tmp / "ca.pem", tmp / "leaf.pem", tmp / "leaf.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


async def test_a_ca_signed_server_certificate_is_verified(tmp_path: Path) -> None:
    """A CA file holding a real CA (not the pinned self-signed case): the chain is verified."""
    ca, leaf, key = _ca_and_leaf(tmp_path)

    async def handler(conn: object) -> None:
        await conn.wait_closed()  # type: ignore[attr-defined]

    server = await serve("127.0.0.1", 0, leaf, key, handler, settings=SETTINGS, application=MOQT)
    try:
        url = f"moqt://127.0.0.1:{server.port}/"
        conn = await w(connect(url, settings=SETTINGS, ca_file=ca, application=MOQT))
        assert not conn.closed
        await w(conn.aclose())
        (tmp_path / "other").mkdir()
        other, _, _ = _ca_and_leaf(tmp_path / "other")
        with pytest.raises(ConnectionClosed) as e:
            await w(connect(url, settings=SETTINGS, ca_file=other, application=MOQT))
        assert not e.value.application
    finally:
        await w(server.close(grace=0.2))
