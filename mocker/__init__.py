"""mocker: a mock vLLM-style inference engine with real scheduling, KV cache and timing."""

__version__ = "0.1.0"
