"""vLLM flags that mean nothing here: accepted, each warned about once."""

from __future__ import annotations

from mocker.settings import IGNORED_VLLM_FLAGS, resolve, server_settings_from
from tests.support.settings import ALL, parse_flags


def test_ignored_vllm_flags_warn_once_each() -> None:
    ns = parse_flags(["--tensor-parallel-size", "8", "--trust-remote-code", "--dtype", "bfloat16"])
    _, warnings = resolve(ns, ALL, environ={})
    assert warnings == [
        "ignoring --dtype: no meaning for a mock engine",
        "ignoring --tensor-parallel-size: no meaning for a mock engine",
        "ignoring --trust-remote-code: no meaning for a mock engine",
    ]
    assert "gpu_memory_utilization" in IGNORED_VLLM_FLAGS


def test_deployment_vllm_flags_are_accepted_and_data_parallel_is_read() -> None:
    ns = parse_flags(["--kv-offloading-backend", "native", "--data-parallel-size", "2",
                      "--kv-transfer-config", '{"kv_connector": "NixlConnector"}'])  # fmt: skip
    values, warnings = resolve(ns, ALL, environ={})
    assert warnings == ["ignoring --kv-offloading-backend: no meaning for a mock engine"]
    assert server_settings_from(values).data_parallel_size == 2
    # Read, not ignored (mocker.settings.kv_transfer); a connector other than
    # OffloadingConnector changes nothing yet.
    assert values["kv_transfer_config"] == '{"kv_connector": "NixlConnector"}'


def test_scale_out_flag_is_accepted_and_hash_algo_is_read() -> None:
    """--enable-scale-out gates vLLM's render and generate routes; mocker always serves them.
    --prefix-caching-hash-algo was ignored once; it now picks the block hash."""
    ns = parse_flags(["--enable-scale-out", "--prefix-caching-hash-algo", "sha256_cbor"])
    values, warnings = resolve(ns, ALL, environ={})
    assert warnings == ["ignoring --enable-scale-out: no meaning for a mock engine"]
    assert values["prefix_caching_hash_algo"] == "sha256_cbor"
