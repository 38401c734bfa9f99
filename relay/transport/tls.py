"""Self-signed development certificates (ECDSA P-256) and certificate fingerprints."""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CERT_NAME = "cert.pem"
KEY_NAME = "key.pem"


@dataclass(frozen=True, slots=True)
class CertificatePaths:
    """Where a certificate and its key live, and the certificate's SHA-256 fingerprint."""

    certfile: Path
    keyfile: Path
    fingerprint: str
    """Lower-case hex SHA-256 of the DER certificate (what WebTransport
    ``serverCertificateHashes`` and pinning compare)."""


def fingerprint(certfile: str | os.PathLike[str]) -> str:
    """SHA-256 fingerprint (hex) of the first certificate in a PEM file."""
    cert = x509.load_pem_x509_certificate(Path(certfile).read_bytes())
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def pinned_self_signed(certfile: str | os.PathLike[str]) -> str | None:
    """The SHA-256 fingerprint (hex) if ``certfile`` holds exactly one certificate and it
    is a self-signed end-entity certificate (not a CA), else None."""
    certs = x509.load_pem_x509_certificates(Path(certfile).read_bytes())
    if len(certs) != 1 or certs[0].issuer != certs[0].subject:
        return None
    try:
        is_ca = certs[0].extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if is_ca:
        return None
    return hashlib.sha256(certs[0].public_bytes(serialization.Encoding.DER)).hexdigest()


def ensure_self_signed(directory: str | os.PathLike[str], *,
                       hostnames: tuple[str, ...] = ("localhost",),
                       addresses: tuple[str, ...] = ("127.0.0.1", "::1"),
                       days: int = 14) -> CertificatePaths:
    """Load ``cert.pem``/``key.pem`` from ``directory``, creating them first if absent.

    The certificate is self-signed, ECDSA P-256, with SANs for ``hostnames`` and
    ``addresses``. Validity is short (14 days by default) because WebTransport
    certificate-hash pinning in browsers rejects longer ones, and because these are
    development certificates. An existing pair is never overwritten, so the fingerprint
    stays stable across restarts.
    """
    d = Path(directory)
    certfile, keyfile = d / CERT_NAME, d / KEY_NAME
    if not (certfile.exists() and keyfile.exists()):
        d.mkdir(parents=True, exist_ok=True)
        cert_pem, key_pem = _generate(hostnames, addresses, days)
        # Key first, private from birth; then the certificate, so a reader that sees the
        # certificate always finds its key.
        _write_private(keyfile, key_pem)
        tmp = certfile.with_suffix(".tmp")
        tmp.write_bytes(cert_pem)
        tmp.replace(certfile)
    return CertificatePaths(certfile, keyfile, fingerprint(certfile))


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)


def _generate(hostnames: tuple[str, ...], addresses: tuple[str, ...],
              days: int) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                         hostnames[0] if hostnames else "kvcs-relay")])
    now = datetime.datetime.now(datetime.UTC)
    san: list[x509.GeneralName] = [x509.DNSName(h) for h in hostnames]
    san += [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH]),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert_pem, key_pem
