"""Disaggregated prefill/decode, as vLLM's NixlConnector does it: a prefill engine holds a
finished request's KV for a decode engine, which pulls it over a bandwidth-limited link."""
