"""vLLM flags that mean nothing without a GPU: accepted with a warning so manifests run as is."""

from __future__ import annotations

import argparse

__all__ = ["IGNORED_PREFIX", "IGNORED_VLLM_FLAGS", "add_ignored_vllm_flags"]

# The argparse dest prefix of an ignored flag (the layering warns about each one given).
IGNORED_PREFIX = "ignored__"

# True: takes a value; False: a bare switch.
IGNORED_VLLM_FLAGS: dict[str, bool] = {
    "dtype": True,
    "swap_space": True,
    "cpu_offload_gb": True,
    "download_dir": True,
    "load_format": True,
    "revision": True,
    "tokenizer_mode": True,
    "distributed_executor_backend": True,
    "max_seq_len_to_capture": True,
    "compilation_config": True,
    "generation_config": True,
    "trust_remote_code": False,
    "enforce_eager": False,
    "disable_custom_all_reduce": False,
    "disable_frontend_multiprocessing": False,
    "disable_log_stats": False,
    # vLLM serves the render and generate routes only with it; mocker always does.
    "enable_scale_out": False,
    # Flags of vLLM deployments (llm-d manifests) that change nothing here.
    "api_server_count": True,
    "max_log_len": True,
    "reasoning_parser": True,
    # More of `vllm serve`'s flags seen in manifests and launch scripts: compilation and
    # CUDA graphs, parallelism across nodes and experts, speculative decoding, multimodal
    # inputs, structured outputs, tracing, CORS, sleep mode, plugins. None changes what a
    # mock engine models.
    "async_scheduling": False,
    "max_cudagraph_capture_size": True,
    "cuda_graph_sizes": True,
    "attention_backend": True,
    "disable_cascade_attn": False,
    "calculate_kv_scales": False,
    "mamba_ssm_cache_dtype": True,
    "speculative_config": True,
    "enable_eplb": False,
    "eplb_config": True,
    "all2all_backend": True,
    "enable_dbo": False,
    "data_parallel_size_local": True,
    "data_parallel_rank": True,
    "data_parallel_start_rank": True,
    "data_parallel_address": True,
    "data_parallel_rpc_port": True,
    "data_parallel_backend": True,
    "data_parallel_hybrid_lb": False,
    "data_parallel_external_lb": False,
    "headless": False,
    "max_num_partial_prefills": True,
    "max_long_partial_prefills": True,
    "num_scheduler_steps": True,
    "preemption_mode": True,
    "limit_mm_per_prompt": True,
    "mm_processor_kwargs": True,
    "disable_chunked_mm_input": False,
    "enable_prompt_embeds": False,
    "chat_template_content_format": True,
    "response_role": True,
    "structured_outputs_config": True,
    "guided_decoding_backend": True,
    "logits_processors": True,
    "tool_parser_plugin": True,
    "hf_overrides": True,
    "hf_config_path": True,
    "override_generation_config": True,
    "config_format": True,
    "model_impl": True,
    "tokenizer_revision": True,
    "code_revision": True,
    "max_parallel_loading_workers": True,
    "worker_extension_cls": True,
    "middleware": True,
    "otlp_traces_endpoint": True,
    "collect_detailed_traces": True,
    "enable_log_outputs": False,
    "enable_server_load_tracking": False,
    "enable_sleep_mode": False,
    "enable_request_id_headers": False,  # (mocker sends X-Request-Id always)
    "disable_fastapi_docs": False,
    "allowed_origins": True,
    "allowed_methods": True,
    "allowed_headers": True,
    "allow_credentials": False,
    "enable_ssl_refresh": False,
}

# Short spellings of ignored flags, as vLLM's (-O3: the compilation level).
_SHORT = {"compilation_config": "-O"}


def add_ignored_vllm_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "vLLM flags accepted and ignored (they mean nothing without a GPU)"
    )
    for dest, takes_value in IGNORED_VLLM_FLAGS.items():
        flag = "--" + dest.replace("_", "-")
        flags = [flag, _SHORT[dest]] if dest in _SHORT else [flag]
        if takes_value:
            group.add_argument(
                *flags, dest=IGNORED_PREFIX + dest, default=argparse.SUPPRESS, metavar="VALUE",
                help="ignored",
            )  # fmt: skip
        else:
            # vLLM's switches come in pairs (argparse.BooleanOptionalAction): both accepted.
            group.add_argument(
                flag, "--no-" + flag[2:], dest=IGNORED_PREFIX + dest, action="store_true",
                default=argparse.SUPPRESS, help="ignored",
            )  # fmt: skip
