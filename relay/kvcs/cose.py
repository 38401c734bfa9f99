"""``manifest.cose``: the manifest as a COSE_Sign1 (RFC 9052) signed with ES256 or EdDSA.

    COSE_Sign1 = #6.18([protected: bstr .cbor {1: alg, 4: kid}, unprotected: {},
                        payload: bstr (manifest JSON), signature: bstr])
    Sig_structure = ["Signature1", protected, h'' (external AAD), payload]

ES256 signatures are r || s (2 x 32 octets), never DER (RFC 9053 2.1). The profile puts kid
in the protected header; a kid found only in the unprotected header is accepted too (RFC 9052
allows it there), since the signature check against that kid's key is what authenticates.

Key store directories hold one PEM public key per kid, named ``<kid>.pem`` where the file stem
is the kid as UTF-8 text. Use ``KeyStore`` with a mapping for kids that are not text.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import cbor2
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import (
    decode_dss_signature,
    encode_dss_signature,
)

from .errors import (
    AlgorithmMismatchError,
    BadSignatureError,
    DerSignatureError,
    MalformedCoseError,
    NotCoseSign1Error,
    UnknownKidError,
    UnsupportedAlgorithmError,
)

COSE_SIGN1_TAG = 18
ALG_ES256 = -7
ALG_EDDSA = -8
HDR_ALG = 1
HDR_CRIT = 2
HDR_KID = 4

PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
PublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey


def sig_structure(protected: bytes, payload: bytes, external_aad: bytes = b"") -> bytes:
    return cbor2.dumps(["Signature1", protected, external_aad, payload])


def alg_for_key(key: PrivateKey | PublicKey) -> int:
    if isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        return ALG_EDDSA
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) \
            and isinstance(key.curve, ec.SECP256R1):
        return ALG_ES256
    raise UnsupportedAlgorithmError(f"{type(key).__name__} is neither P-256 nor Ed25519")


def sign_manifest(payload: bytes, private_key: PrivateKey, kid: bytes) -> bytes:
    """COSE_Sign1 (tag 18) over the manifest JSON octets, alg chosen from the key type."""
    alg = alg_for_key(private_key)
    protected = cbor2.dumps({HDR_ALG: alg, HDR_KID: bytes(kid)}, canonical=True)
    to_sign = sig_structure(protected, bytes(payload))
    if isinstance(private_key, ed25519.Ed25519PrivateKey):
        signature = private_key.sign(to_sign)
    else:
        r, s = decode_dss_signature(private_key.sign(to_sign, ec.ECDSA(hashes.SHA256())))
        signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    return cbor2.dumps(cbor2.CBORTag(COSE_SIGN1_TAG, [protected, {}, bytes(payload),
                                                       signature]))


class KeyStore:
    """Producer public keys by kid (octets)."""

    def __init__(self, keys: Mapping[bytes, PublicKey | bytes] | None = None) -> None:
        self._keys: dict[bytes, PublicKey] = {}
        for kid, key in (keys or {}).items():
            self.add(kid, key)

    def add(self, kid: bytes, key: PublicKey | bytes) -> None:
        """Register a public key object, or PEM octets of one."""
        if isinstance(key, bytes):
            loaded = serialization.load_pem_public_key(key)
            if not isinstance(loaded, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey):
                raise UnsupportedAlgorithmError(f"key for kid {kid!r} is neither EC nor Ed25519")
            key = loaded
        alg_for_key(key)  # refuse curves other than P-256 up front
        self._keys[bytes(kid)] = key

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> KeyStore:
        """Load every ``<kid>.pem`` in ``path`` (kid = the file stem as UTF-8)."""
        store = cls()
        for pem in sorted(Path(path).glob("*.pem")):
            store.add(pem.stem.encode("utf-8"), pem.read_bytes())
        return store

    def get(self, kid: bytes) -> PublicKey:
        try:
            return self._keys[bytes(kid)]
        except KeyError:
            raise UnknownKidError(f"kid {bytes(kid)!r} is not in the key store") from None

    def __contains__(self, kid: object) -> bool:
        return isinstance(kid, bytes) and kid in self._keys

    def __len__(self) -> int:
        return len(self._keys)


@dataclass(frozen=True)
class VerifiedManifest:
    payload: bytes
    kid: bytes
    alg: int


def _decode_header_map(protected: bytes) -> Mapping[object, object]:
    if protected == b"":
        return {}
    try:
        value = cbor2.loads(protected)
    except (cbor2.CBORDecodeError, ValueError) as exc:
        raise MalformedCoseError(f"protected header is not CBOR: {exc}") from None
    if not isinstance(value, Mapping):
        raise MalformedCoseError("protected header is not a CBOR map")
    return value


def verify_manifest_cose(data: bytes, keys: KeyStore) -> VerifiedManifest:
    """Verify a manifest.cose Object; return the manifest JSON octets (not yet parsed)."""
    raw = bytes(data)
    stream = io.BytesIO(raw)
    try:
        msg = cbor2.CBORDecoder(stream).decode()
    except (cbor2.CBORDecodeError, ValueError, EOFError) as exc:
        raise NotCoseSign1Error(f"manifest.cose is not CBOR: {exc}") from None
    if stream.tell() != len(raw):
        raise NotCoseSign1Error("manifest.cose has octets after its CBOR item")
    if not isinstance(msg, cbor2.CBORTag):
        raise NotCoseSign1Error("manifest.cose is untagged; COSE_Sign1 needs CBOR tag 18")
    if msg.tag != COSE_SIGN1_TAG:
        raise NotCoseSign1Error(f"manifest.cose has CBOR tag {msg.tag}, not 18 (COSE_Sign1)")
    body = msg.value
    # cbor2 decodes the contents of a tag immutably: a tuple and frozendict, not list / dict.
    if not isinstance(body, list | tuple) or len(body) != 4:
        raise NotCoseSign1Error("COSE_Sign1 must be an array of 4 elements")
    protected, unprotected, payload, signature = body
    if not isinstance(protected, bytes) or not isinstance(unprotected, Mapping):
        raise MalformedCoseError("COSE_Sign1 headers must be a bstr and a map")
    if not isinstance(payload, bytes):
        raise MalformedCoseError("COSE_Sign1 payload must be attached (a bstr)")
    if not isinstance(signature, bytes):
        raise MalformedCoseError("COSE_Sign1 signature must be a bstr")
    headers = _decode_header_map(protected)
    if HDR_CRIT in headers:
        raise MalformedCoseError("critical header parameters are not supported")
    if HDR_ALG in unprotected:
        raise MalformedCoseError("alg must be in the protected header")
    alg = headers.get(HDR_ALG)
    if alg is None:
        raise MalformedCoseError("protected header lacks alg (1)")
    kid = headers.get(HDR_KID, unprotected.get(HDR_KID))
    if not isinstance(kid, bytes):
        raise MalformedCoseError("kid (4) must be present and a bstr")
    if alg not in (ALG_ES256, ALG_EDDSA):
        raise UnsupportedAlgorithmError(f"alg {alg!r} is neither ES256 (-7) nor EdDSA (-8)")
    key = keys.get(kid)
    if alg_for_key(key) != alg:
        raise AlgorithmMismatchError(
            f"alg {alg} does not fit the {type(key).__name__} registered for kid {kid!r}"
        )
    to_verify = sig_structure(protected, payload)
    try:
        if isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, to_verify)
        else:
            if len(signature) != 64:
                if signature[:1] == b"\x30":
                    raise DerSignatureError(
                        "ES256 signature looks DER-encoded; COSE requires 64-octet r || s"
                    )
                raise BadSignatureError(f"ES256 signature has {len(signature)} octets, not 64")
            der = encode_dss_signature(int.from_bytes(signature[:32], "big"),
                                       int.from_bytes(signature[32:], "big"))
            key.verify(der, to_verify, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise BadSignatureError(f"manifest.cose signature by kid {kid!r} does not verify"
                                ) from None
    return VerifiedManifest(payload, kid, alg)


def load_private_key(path: str | os.PathLike[str], password: bytes | None = None
                     ) -> PrivateKey:
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=password)
    if not isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
        raise UnsupportedAlgorithmError(f"{type(key).__name__} is neither P-256 nor Ed25519")
    alg_for_key(key)
    return key


def public_pem(key: PrivateKey | PublicKey) -> bytes:
    """PEM (SubjectPublicKeyInfo) of a key's public half, for a key store directory."""
    pub = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey
                                         | ed25519.Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo)
