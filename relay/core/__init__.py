"""The relay core: routing, subscriptions, fan-out, caching, upstream. Who owns what:

- ``relay.py``: `Relay`, the composition: session admission (``max_sessions``), the Track
  registry (create, sweep), and the parts below; shutdown; the sessions' SETUP values
  (``relay_session_config``).
- ``handler.py``: one downstream session's requests (PUBLISH_NAMESPACE, PUBLISH,
  SUBSCRIBE_NAMESPACE, SUBSCRIBE with fill, FETCH, TRACK_STATUS): authorization, then the
  Track and the routing.
- ``track.py``: one relayed Track: its upstream subscription, its cache entries, its
  Forwarders, serving a range of it (fills and FETCHes) from the cache.
- ``forwarder.py``: fan-out to one downstream subscription; ``scheduler.py``: send order per
  session (§13).
- ``routing.py``: where a request the cache cannot answer goes (own publishers, lower
  relays, siblings, the upstream relay), coalesced, and what was learned of absence.
- ``namespaces.py``: who publishes which namespace, who listens, what each may be shown.
- ``persistence.py``: complete Tracks into LMDB, expiry, the namespaces LMDB holds.
- ``announce.py``, ``push.py``, ``upstream.py``, ``siblings.py``: the links of a tree
  (announcing up, pushing up, the upstream link, the sibling links: the workers of one
  relay and the peer relays of one tier); ``loops.py``: an upstream that leads back to the
  relay is refused (the loop probe).
- ``auth.py``: tokens and roles; ``purge.py``: the admin purge; ``cache.py``: received
  Objects into the store's records; ``counters.py``: what is counted (exported by
  relay/metrics.py).

Seams: the core uses the session layer (relay.session) for every request and stream, and
imports nothing of the transport: a failed link is the session's ``LinkError``, a send
stream's backlog a ``SendBacklog``, connections and QUIC settings are handed through under
the session's names (relay/session/handles.py). Its options (``RelayOptions``) come from
relay/options.py, the settings defined once. It reaches the store (storage) through
`TieredStore`, and never the KVCS library (it does not read payloads). tests/test_layers.py
checks the imports.
"""
