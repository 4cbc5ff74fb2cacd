"""Test support: engines, workloads, servers, KV-event consumers and parsers shared by tests."""
