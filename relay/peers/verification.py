"""Verification (kvcs-draft 5.4): manifests (3.6, COSE_Sign1) and Objects (3.5) as they come.

Manifests: ``manifest.cose`` is verified against the producer key store; a plain ``manifest``
is refused when producer authenticity is required. Every version must hash to the namespace's
Compatibility ID, equal the consumer's descriptor, and only extend the previous version.

Objects: 3.5's checks always; the manifest's listed digest when the version at hand lists
the Group. During production the manifest lags the data by up to eight layers, so an Object
whose digest is not listed yet is used on the strength of 3.5 and re-checked when a later
version lists it; a mismatch then withdraws it from the reassembly (``forget``) and the
block counts as missing again. When producer authenticity is required, 3.5 is not enough
(anyone can write a self-consistent header): such an Object is held, its layer not usable,
until a verified signed version lists its digest (``RetrievalState.require_listed``).
"""

from __future__ import annotations

import cbor2

from relay.kvcs.cose import KeyStore, verify_manifest_cose
from relay.kvcs.descriptor import Descriptor
from relay.kvcs.errors import CoseError, KvcsError, ManifestError
from relay.kvcs.manifest import Manifest, manifest_for_namespace
from relay.kvcs.namespace import KvcsNamespace
from relay.kvcs.payload import VerifiedObject, verify_object
from relay.kvcs.reassembly import SegmentReassembler
from relay.kvcs.track_names import MANIFEST_COSE

from .errors import Refused


class ManifestRefused(Refused):
    """This publication's manifest cannot be trusted: do not use the publication."""


class ManifestVerifier:
    def __init__(self, namespace: KvcsNamespace, descriptor: Descriptor, *,
                 keys: KeyStore | None = None, require_cose: bool = False) -> None:
        self.namespace = namespace
        self.descriptor = descriptor
        self.keys = keys
        self.require_cose = require_cose
        self.current: Manifest | None = None
        self.group = -1
        self.kid: bytes | None = None
        self.signed = False

    def accept(self, track: str, group: int, payload: bytes | memoryview) -> Manifest | None:
        """Verify one manifest version; return it if newer than the current one (else None).
        Raises ManifestRefused when the publication must be discarded."""
        body = bytes(payload)
        if track == MANIFEST_COSE:
            body = self._unwrap(body)
            self.signed = True
        elif self.require_cose:
            raise ManifestRefused("manifest.cose is required but the publication has only an "
                                  "unsigned manifest")
        try:
            manifest = manifest_for_namespace(body, self.namespace)
        except ManifestError as e:
            # the cause keeps the failed check's type (CompatMismatchError, ...) for callers
            raise ManifestRefused(f"manifest rejected: {e}") from e
        if manifest.compat != self.descriptor:
            raise ManifestRefused("manifest rejected: its Compatibility Descriptor differs "
                                  "from ours")
        if group <= self.group:
            return None
        if self.current is not None:
            try:
                self.current.check_successor(manifest)
            except ManifestError as e:
                raise ManifestRefused(f"manifest version {group} rejected: {e}") from None
        self.current, self.group = manifest, group
        return manifest

    def _unwrap(self, body: bytes) -> bytes:
        if self.keys is None or len(self.keys) == 0:
            if self.require_cose:
                raise ManifestRefused("manifest.cose cannot be verified: no producer keys")
            # Authenticity not required and no keys to check it: read the payload only.
            try:
                return bytes(cbor2.loads(body).value[2])
            except (ValueError, TypeError, IndexError, AttributeError,
                    cbor2.CBORDecodeError) as e:
                raise ManifestRefused(f"manifest.cose is malformed: {e}") from None
        try:
            verified = verify_manifest_cose(body, self.keys)
        except CoseError as e:
            raise ManifestRefused(f"manifest.cose refused: {e}") from None
        self.kid = verified.kid
        return verified.payload


def check_object(manifest: Manifest, track: str, group: int, object_id: int,
                 payload: bytes | memoryview) -> tuple[VerifiedObject, bool]:
    """3.5 plus the manifest's context and listed digest; (Object, digest was listed).
    Raises a KvcsError for an Object that must be discarded."""
    obj = verify_object(payload, group, object_id)
    return obj, manifest.check_object(track, obj)


class Reassembler(SegmentReassembler):
    """A SegmentReassembler that can withdraw a block found bad after it was accepted."""

    def forget(self, track: str, layer: int, block: int) -> None:
        have = self._have.get((track, layer))
        if have is not None:
            have.discard(block)
            self.layer_ready_at.pop(layer, None)

    def has(self, track: str, layer: int, block: int) -> bool:
        return block in self._have.get((track, layer), ())


__all__ = ["KvcsError", "ManifestRefused", "ManifestVerifier", "Reassembler", "check_object"]
