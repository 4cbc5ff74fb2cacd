"""KV events for routers: vLLM's ZMQ wire format, its configuration and the publisher."""
