"""The relay tree as LMCache's remote KV tier: a remote-storage plugin for LMCache 0.5.6.

- ``settings``  the ``kvcs://HOST:PORT/?...`` URL and LMCache's ``extra_config``
- ``mapping``   a CacheEngineKey as KVCS names: scope, Compatibility ID, anchor key,
                Publication ID, track (docs/engines.md, "LMCache")
- ``chunks``    a chunk's MemoryObj <-> KVCS Objects (one Group per layer)
- ``connector`` the ConnectorAdapter and RemoteConnector LMCache loads

Only ``connector`` imports LMCache (and so torch); it turns LMCache's usage reporting off
before that import. The relay itself never imports this package.
"""
