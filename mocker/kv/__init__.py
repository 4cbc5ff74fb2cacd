"""KV cache: block hashing, the device block pool, eviction and per-request allocation."""
