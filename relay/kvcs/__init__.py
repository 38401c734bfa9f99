"""KVCS profile library: the publisher/subscriber side of KV cache streaming over MOQT.

It implements the KVSP primitives the profile builds on (`KVSP-PROFILE.md`: Compatibility
Descriptor and ID, Scope ID, Block Keys, codec registry, raw sections, layer digest) and the
KVCS formats (`kvcs-draft` 3.1-3.6, 5.1-5.4): namespace, track names, Object payload, manifest
and its COSE_Sign1 form, plus a KV cache file format, a synthetic cache generator, the
producer's publication plan and the consumer's reassembly.

Nothing here does networking, and the relay never imports this package: relays forward KVCS
Objects as opaque bytes. Modules, one concept each:

- ``errors``       every typed error raised by the package
- ``descriptor``   Compatibility Descriptor validation, canonical JSON, ``compat_id``
- ``identifiers``  scope key, ``scope_id``, Block Keys, Anchor Key, Publication ID
- ``namespace``    the five-field KVCS Track Namespace and its prefixes
- ``registry``     components (k/v/kv) and the KVSP codec registry
- ``track_names``  the track-name ABNF of kvcs-draft 3.2
- ``payload``      the 68-octet Object header: encoder and the 3.5 verifier
- ``codecs``       raw / zstd / int8 for k, v and kv Data; raw sections; layer digest
- ``manifest``     the JSON manifest of 3.6: builder, parser, validation, digest checks
- ``cose``         ``manifest.cose``: COSE_Sign1 with ES256 / EdDSA, key store
- ``kvfile``       KV caches in safetensors files, read lazily
- ``synthetic``    deterministic KV caches for tests and benchmarks
- ``plan``         producer side: the ordered Objects and manifest versions to publish
- ``reassembly``   consumer side: verified Objects back into K/V arrays, per-layer readiness
"""
