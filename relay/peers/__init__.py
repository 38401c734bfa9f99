"""Reference KVCS peers: the Original Publisher and the End Subscriber (kvcs-draft 5,
MOQT-PROFILE 15.1-15.2), as libraries and as the ``kvcs publish|subscribe|fetch`` commands.

Modules, one concept each:

- ``errors``      PeerError and the documented exit codes
- ``inputs``      descriptor / token / scope-key / namespace files and strings
- ``connect``     dialling a relay with a bound
- ``publisher``   pushing a PublicationPlan with PUBLISH_NAMESPACE + PUBLISH, confirmation
- ``serving``     the publisher answering FETCH / SUBSCRIBE for what it wrote (15.1 step 6)
- ``discovery``   SUBSCRIBE_NAMESPACE over the consumer's Anchor Keys, longest first, in waves (5.1)
- ``verification`` manifests (3.6, COSE) and Objects (3.5) as they arrive; a forgetful
                  reassembler for late digest mismatches
- ``state``       what one retrieval holds: targets per segment, per-layer statistics
- ``live``        retrieval during production (5.2)
- ``completed``   retrieval of completed caches (5.3)
- ``subscriber``  choosing publications, recovery across relays and publications, the
                  deadline (5.4)
- ``report``      the JSON report
- ``cli``         the click commands
- ``engines``     inference engines behind ``kvcs prefill`` and ``--generate`` (numpy,
                  transformers), imported only when asked for; ``engine_options`` their
                  command-line options
"""
