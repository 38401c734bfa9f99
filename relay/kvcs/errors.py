"""Typed errors of the KVCS library.

Every check that the profile makes a MUST has its own class, so that callers (and tests) can
tell failures apart without parsing messages. All derive from ``KvcsError`` and from
``ValueError`` because each one means "these bytes / this document are not acceptable".
"""

from __future__ import annotations


class KvcsError(ValueError):
    """Base class of every error raised by relay.kvcs."""


# -- identifiers ------------------------------------------------------------------------------


class DescriptorError(KvcsError):
    """The Compatibility Descriptor is not valid (KVSP 1)."""


class ScopeKeyError(KvcsError):
    """A scope key is not 32 octets (or its file is not 32 raw octets / 64 hex digits)."""


class TokenError(KvcsError):
    """A token ID is not an unsigned 32-bit integer."""


class NamespaceError(KvcsError):
    """A Track Namespace is not a KVCS namespace (kvcs-draft 3.1)."""


class TrackNameError(KvcsError):
    """A Track Name does not match the ABNF of kvcs-draft 3.2."""


# -- Object payload (kvcs-draft 3.5) ------------------------------------------------------------


class PayloadError(KvcsError):
    """An Object payload failed a check of kvcs-draft 3.5; the Object is treated as missing."""


class PayloadTooShortError(PayloadError):
    """Fewer octets than the 68-octet header."""


class BadMagicError(PayloadError):
    """Magic is not "KVO1"."""


class BadVersionError(PayloadError):
    """Version is not 1."""


class UnknownComponentError(PayloadError):
    """Component is not 1 (k), 2 (v) or 3 (kv)."""


class LayerMismatchError(PayloadError):
    """Layer differs from the Group ID."""


class BlockIndexMismatchError(PayloadError):
    """Block Index differs from the Object ID."""


class LengthMismatchError(PayloadError):
    """Header plus Data Length do not account for exactly the whole payload."""


class DigestMismatchError(PayloadError):
    """SHA-256 of Data differs from the Data Digest."""


class ObjectContextError(PayloadError):
    """The header disagrees with its track or manifest (component, codec, tokens, range)."""


# -- codecs and files -----------------------------------------------------------------------


class CodecError(KvcsError):
    """Data cannot be encoded or decoded with the given codec."""


class UnknownCodecError(CodecError):
    """The codec name or value is not implemented here (consumers do not subscribe to it)."""


class KvFileError(KvcsError):
    """A KV cache file is malformed or does not match its descriptor."""


# -- manifest (kvcs-draft 3.6) ----------------------------------------------------------------


class ManifestError(KvcsError):
    """The manifest JSON is malformed or inconsistent with itself."""


class CompatMismatchError(ManifestError):
    """compat_id of the manifest's "compat" differs from namespace field 2: discard it all."""


class ManifestDigestMismatchError(ManifestError):
    """An Object's Data Digest differs from the one the manifest lists for it."""


# -- COSE (manifest.cose) ---------------------------------------------------------------------


class CoseError(KvcsError):
    """A manifest.cose payload is not an acceptable COSE_Sign1."""


class NotCoseSign1Error(CoseError):
    """Not CBOR tag 18 (untagged, or another tag), or not a 4-element COSE_Sign1 array."""


class MalformedCoseError(CoseError):
    """Headers or payload are not of the types RFC 9052 requires."""


class UnknownKidError(CoseError):
    """The kid is not in the key store."""


class UnsupportedAlgorithmError(CoseError):
    """alg is neither ES256 (-7) nor EdDSA (-8)."""


class AlgorithmMismatchError(CoseError):
    """alg does not fit the type of the key registered for the kid."""


class DerSignatureError(CoseError):
    """An ES256 signature is DER-encoded; COSE requires the 64-octet r || s form."""


class BadSignatureError(CoseError):
    """The signature does not verify (payload or protected header tampered, wrong key)."""


# -- reassembly ---------------------------------------------------------------------------------


class ReassemblyError(KvcsError):
    """An Object cannot be placed into the cache being rebuilt."""


class MixedPublicationError(ReassemblyError):
    """Objects of two publications in one segment without both being deterministic (5.4)."""
