"""vLLM flags that mean nothing without a GPU: accepted with a warning so manifests run as is."""

from __future__ import annotations

import argparse

__all__ = ["IGNORED_PREFIX", "IGNORED_VLLM_FLAGS", "add_ignored_vllm_flags"]

# The argparse dest prefix of an ignored flag (the layering warns about each one given).
IGNORED_PREFIX = "ignored__"

# True: takes a value; False: a bare switch.
IGNORED_VLLM_FLAGS: dict[str, bool] = {
    "tensor_parallel_size": True,
    "pipeline_parallel_size": True,
    "gpu_memory_utilization": True,
    "dtype": True,
    "kv_cache_dtype": True,
    "quantization": True,
    "swap_space": True,
    "cpu_offload_gb": True,
    "download_dir": True,
    "load_format": True,
    "revision": True,
    "tokenizer_mode": True,
    "max_logprobs": True,
    "distributed_executor_backend": True,
    "max_seq_len_to_capture": True,
    "compilation_config": True,
    "tool_call_parser": True,
    "generation_config": True,
    "trust_remote_code": False,
    "enforce_eager": False,
    "disable_custom_all_reduce": False,
    "enable_auto_tool_choice": False,
    "disable_frontend_multiprocessing": False,
    "disable_log_stats": False,
    # vLLM serves the render and generate routes only with it; mocker always does.
    "enable_scale_out": False,
    # Flags of vLLM deployments (llm-d manifests) that change nothing here.
    "kv_offloading_backend": True,
    "api_server_count": True,
    "max_log_len": True,
    "reasoning_parser": True,
}


def add_ignored_vllm_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "vLLM flags accepted and ignored (they mean nothing without a GPU)"
    )
    for dest, takes_value in IGNORED_VLLM_FLAGS.items():
        flag = "--" + dest.replace("_", "-")
        if takes_value:
            group.add_argument(
                flag, dest=IGNORED_PREFIX + dest, default=argparse.SUPPRESS, metavar="VALUE",
                help="ignored",
            )  # fmt: skip
        else:
            group.add_argument(
                flag, dest=IGNORED_PREFIX + dest, action="store_true",
                default=argparse.SUPPRESS, help="ignored",
            )  # fmt: skip
