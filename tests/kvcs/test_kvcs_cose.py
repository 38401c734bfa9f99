"""manifest.cose: COSE_Sign1 with ES256 / EdDSA, interop both ways, every rejection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cbor2
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import (
    decode_dss_signature,
    encode_dss_signature,
)

from relay.kvcs.cose import (
    ALG_EDDSA,
    ALG_ES256,
    KeyStore,
    PrivateKey,
    load_private_key,
    public_pem,
    sign_manifest,
    verify_manifest_cose,
)
from relay.kvcs.errors import (
    AlgorithmMismatchError,
    BadSignatureError,
    CoseError,
    DerSignatureError,
    MalformedCoseError,
    NotCoseSign1Error,
    UnknownKidError,
    UnsupportedAlgorithmError,
)

PAYLOAD = b'{"kvcs":1,"segments":[]}'
EC_KEY = ec.generate_private_key(ec.SECP256R1())
ED_KEY = ed25519.Ed25519PrivateKey.generate()
KEYS = {b"ec-1": EC_KEY, b"ed-1": ED_KEY}


def store() -> KeyStore:
    return KeyStore({kid: key.public_key() for kid, key in KEYS.items()})


def rfc9052_sign(protected_map: dict[int, Any], key: PrivateKey, payload: bytes, *,
                 unprotected: dict[int, Any] | None = None, der: bool = False) -> bytes:
    """A COSE_Sign1 built straight from RFC 9052 section 4.4, independent of relay.kvcs."""
    protected = cbor2.dumps(protected_map)
    to_sign = cbor2.dumps(["Signature1", protected, b"", payload])
    if isinstance(key, ed25519.Ed25519PrivateKey):
        sig = key.sign(to_sign)
    else:
        sig = key.sign(to_sign, ec.ECDSA(hashes.SHA256()))
        if not der:
            r, s = decode_dss_signature(sig)
            sig = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    return cbor2.dumps(cbor2.CBORTag(18, [protected, unprotected or {}, payload, sig]))


@pytest.mark.parametrize(("kid", "alg"), [(b"ec-1", ALG_ES256), (b"ed-1", ALG_EDDSA)])
def test_ours_verifies_independently(kid: bytes, alg: int) -> None:
    msg = cbor2.loads(sign_manifest(PAYLOAD, KEYS[kid], kid))
    assert isinstance(msg, cbor2.CBORTag) and msg.tag == 18
    protected, unprotected, payload, sig = msg.value
    assert cbor2.loads(protected) == {1: alg, 4: kid} and dict(unprotected) == {}
    assert payload == PAYLOAD
    to_verify = cbor2.dumps(["Signature1", protected, b"", payload])
    pub = KEYS[kid].public_key()
    if alg == ALG_ES256:
        assert len(sig) == 64
        der = encode_dss_signature(int.from_bytes(sig[:32], "big"),
                                   int.from_bytes(sig[32:], "big"))
        pub.verify(der, to_verify, ec.ECDSA(hashes.SHA256()))  # type: ignore[call-arg]
    else:
        pub.verify(sig, to_verify)  # type: ignore[call-arg]
    result = verify_manifest_cose(sign_manifest(PAYLOAD, KEYS[kid], kid), store())
    assert (result.payload, result.kid, result.alg) == (PAYLOAD, kid, alg)


@pytest.mark.parametrize(("kid", "alg"), [(b"ec-1", ALG_ES256), (b"ed-1", ALG_EDDSA)])
def test_hand_built_verifies_with_ours(kid: bytes, alg: int) -> None:
    # Header members in the other order: verification must use the protected octets as sent.
    msg = rfc9052_sign({4: kid, 1: alg}, KEYS[kid], PAYLOAD)
    assert verify_manifest_cose(msg, store()).payload == PAYLOAD
    # kid in the unprotected bucket (RFC 9052 allows it) is accepted too.
    msg = rfc9052_sign({1: alg}, KEYS[kid], PAYLOAD, unprotected={4: kid})
    assert verify_manifest_cose(msg, store()).kid == kid


def test_key_store_from_pem_directory(tmp_path: Path) -> None:
    for kid, key in KEYS.items():
        (tmp_path / f"{kid.decode()}.pem").write_bytes(public_pem(key))
    keys = KeyStore.from_directory(tmp_path)
    assert len(keys) == 2 and b"ec-1" in keys
    assert verify_manifest_cose(sign_manifest(PAYLOAD, ED_KEY, b"ed-1"), keys).kid == b"ed-1"
    from cryptography.hazmat.primitives import serialization
    pem = ED_KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())
    (tmp_path / "priv.key").write_bytes(pem)
    assert isinstance(load_private_key(tmp_path / "priv.key"), ed25519.Ed25519PrivateKey)
    # a password-protected key opens with its password only
    locked = EC_KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(b"s3cret"))
    (tmp_path / "locked.key").write_bytes(locked)
    opened = load_private_key(tmp_path / "locked.key", b"s3cret")
    assert public_pem(opened) == public_pem(EC_KEY)
    with pytest.raises(TypeError):  # cryptography: the key is encrypted, no password given
        load_private_key(tmp_path / "locked.key")


def test_key_store_membership_and_public_pem_of_either_half() -> None:
    keys = store()
    assert b"ec-1" in keys and b"nobody" not in keys and "ec-1" not in keys
    assert public_pem(EC_KEY.public_key()) == public_pem(EC_KEY)


def test_other_curves_refused() -> None:
    with pytest.raises(UnsupportedAlgorithmError):
        KeyStore({b"p384": ec.generate_private_key(ec.SECP384R1()).public_key()})


def tamper(msg: bytes, index: int, value: Any) -> bytes:
    body = list(cbor2.loads(msg).value)
    body[index] = value
    return cbor2.dumps(cbor2.CBORTag(18, body))


SIGNED_EC = sign_manifest(PAYLOAD, EC_KEY, b"ec-1")
SIGNED_ED = sign_manifest(PAYLOAD, ED_KEY, b"ed-1")


@pytest.mark.parametrize(("msg", "error"), [
    (sign_manifest(PAYLOAD, ED_KEY, b"nobody"), UnknownKidError),
    # alg -8 (from the Ed25519 signer) but kid ec-1 registers a P-256 key
    (rfc9052_sign({1: ALG_EDDSA, 4: b"ec-1"}, ED_KEY, PAYLOAD), AlgorithmMismatchError),
    (rfc9052_sign({1: ALG_ES256, 4: b"ed-1"}, EC_KEY, PAYLOAD), AlgorithmMismatchError),
    (rfc9052_sign({1: -35, 4: b"ec-1"}, EC_KEY, PAYLOAD), UnsupportedAlgorithmError),
    (tamper(SIGNED_EC, 2, PAYLOAD + b" "), BadSignatureError),
    (tamper(SIGNED_ED, 2, b"{}"), BadSignatureError),
    (tamper(SIGNED_EC, 0, cbor2.dumps({1: ALG_ES256, 4: b"ec-1", 3: 0})), BadSignatureError),
    (tamper(SIGNED_ED, 0, cbor2.dumps({4: b"ed-1", 1: ALG_EDDSA})), BadSignatureError),
    (tamper(SIGNED_EC, 3, bytes(64)), BadSignatureError),
    (rfc9052_sign({1: ALG_ES256, 4: b"ec-1"}, EC_KEY, PAYLOAD, der=True), DerSignatureError),
    (cbor2.dumps(list(cbor2.loads(SIGNED_EC).value)), NotCoseSign1Error),               # untagged
    (cbor2.dumps(cbor2.CBORTag(98, list(cbor2.loads(SIGNED_EC).value))), NotCoseSign1Error),
    (cbor2.dumps(cbor2.CBORTag(18, list(cbor2.loads(SIGNED_EC).value)[:3])), NotCoseSign1Error),
    (SIGNED_EC + b"\x00", NotCoseSign1Error),
    (b"\xff\xff", NotCoseSign1Error),
    (tamper(SIGNED_EC, 2, None), MalformedCoseError),                             # detached
    (tamper(SIGNED_EC, 0, cbor2.dumps({4: b"ec-1"})), MalformedCoseError),        # no alg
    (tamper(SIGNED_EC, 0, cbor2.dumps([1])), MalformedCoseError),
    (tamper(SIGNED_EC, 0, b""), MalformedCoseError),
    (tamper(SIGNED_EC, 1, {1: ALG_ES256}), MalformedCoseError),
    (tamper(SIGNED_EC, 0, 5), MalformedCoseError),                 # protected not a bstr
    (tamper(SIGNED_EC, 1, [1]), MalformedCoseError),               # unprotected not a map
    (rfc9052_sign({1: ALG_ES256, 2: [3], 4: b"ec-1"}, EC_KEY, PAYLOAD), MalformedCoseError),
    (rfc9052_sign({1: ALG_ES256, 4: "ec-1"}, EC_KEY, PAYLOAD), MalformedCoseError),
], ids=lambda v: "msg" if isinstance(v, bytes) else None)  # the same names in every process:
# the signatures are random, and pytest-xdist's workers must collect the same test IDs
def test_rejections(msg: bytes, error: type[CoseError]) -> None:
    with pytest.raises(error):
        verify_manifest_cose(msg, store())
