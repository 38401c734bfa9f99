"""kvcs-relay: a caching MOQT (draft-22) relay for LLM KV caches."""
