"""Storage tiers for the relay: memory (cachetools) and LMDB (completed tracks)."""
