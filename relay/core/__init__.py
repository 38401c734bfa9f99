"""The relay core: routing, subscriptions, fan-out, caching, upstream. Who owns what:

- ``relay.py``: `Relay`, the wiring: it builds the parts below and hands each what it uses
  (no part holds the Relay; docs/relay.md, "The core's parts"); session admission
  (``max_sessions``); shutdown; the sessions' SETUP values (``relay_session_config``).
- ``parts.py``: `RelayParts`, the parts a session's requests reach, handed to every handler.
- ``registry.py``: the Track registry (create, find, sweep).
- ``handler.py``: one downstream session's requests (PUBLISH_NAMESPACE, PUBLISH,
  SUBSCRIBE_NAMESPACE, SUBSCRIBE with fill, FETCH, TRACK_STATUS): authorization, then the
  Track and the routing.
- ``track.py``: one relayed Track: its upstream subscription, its cache entries, its
  Forwarders; ``range_serve.py``: serving a range of it (fills and FETCHes) from the cache.
- ``forwarder.py``: fan-out to one downstream subscription; ``scheduler.py``: send order per
  session (§13).
- ``routing.py``: where a request the cache cannot answer goes (own publishers, lower
  relays, siblings, the upstream relay), coalesced, and what was learned of absence;
  ``learned.py``: the namespaces learned from other relays (and those kept while their
  Objects are held here); ``upstream_namespaces.py``: SUBSCRIBE_NAMESPACE up.
- ``namespaces.py``: who publishes which namespace, who listens, what each may be shown.
- ``persistence.py``: complete Tracks into LMDB, expiry, the namespaces LMDB holds.
- ``announce.py``, ``push.py``, ``upstream.py``, ``siblings.py``: the links of a tree
  (announcing up, pushing up, the upstream link, the sibling links: the workers of one
  relay and the peer relays of one tier); ``loops.py``: an upstream that leads back to the
  relay is refused (the loop probe); ``rendezvous.py``: SUBSCRIBEs held for a publisher;
  ``track_offers.py``: SUBSCRIBE_TRACKS served.
- ``auth.py``: tokens and roles; ``purge.py``: the admin purge; ``cache.py``: received
  Objects into the store's records; ``counters.py``: what is counted (exported by
  relay/metrics.py), and what one fill or FETCH served (``ServeStats``).

Seams: the core uses the session layer (relay.session) for every request and stream, and
imports nothing of the transport: a failed link is the session's ``LinkError``, a send
stream's backlog a ``SendBacklog``, connections and QUIC settings are handed through under
the session's names (relay/session/handles.py). Its options (``RelayOptions``) come from
relay/options.py, the settings defined once. It reaches the store (storage) through
`TieredStore`, and never the KVCS library (it does not read payloads). tests/test_layers.py
checks the imports, and that relay/core's modules import no cycle.
"""
