"""vLLM's render endpoints' body: what the engine would run for a request (the prompt's token
ids after templating, the sampling parameters), as vLLM's GenerateRequest, without running it.

The token ids come from the same functions the completion routes use, so a router that
renders first hashes exactly the blocks the engine will.
"""

from __future__ import annotations

from typing import Any

from mocker.api.chat_bodies import ChatCompletionRequest
from mocker.api.completion_bodies import CompletionRequest
from mocker.request import SamplingParams

__all__ = ["generate_request"]

# vLLM's SamplingParams defaults: a render body lists only the fields that differ (msgspec's
# omit_defaults), max_tokens always (it is resolved from the context when not given).
_DEFAULTS: dict[str, Any] = {
    "n": 1,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "seed": None,
    "stop": [],
    "stop_token_ids": [],
    "ignore_eos": False,
    "min_tokens": 0,
    "include_stop_str_in_output": False,
    "skip_special_tokens": True,
    "logprobs": None,
    "prompt_logprobs": None,
}


def _sampling_params(
    body: CompletionRequest | ChatCompletionRequest, sampling: SamplingParams
) -> dict[str, Any]:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    asked = (body.model_extra or {}).get("prompt_logprobs")  # (checked by the caller)
    prompt_logprobs = None if asked is None else int(asked)
    if isinstance(body, ChatCompletionRequest):
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
    else:  # (echo scores the prompt too: vLLM asks the engine for its logprobs)
        logprobs = body.logprobs
        if body.echo and logprobs is not None and prompt_logprobs is None:
            prompt_logprobs = logprobs
    values: dict[str, Any] = {
        "n": body.n,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "seed": body.seed,
        "stop": stop,
        "stop_token_ids": list(sampling.stop_token_ids),
        "ignore_eos": body.ignore_eos,
        "min_tokens": sampling.min_tokens,
        "include_stop_str_in_output": body.include_stop_str_in_output,
        "skip_special_tokens": body.skip_special_tokens,
        "logprobs": logprobs,
        "prompt_logprobs": prompt_logprobs,
    }
    out = {"max_tokens": sampling.max_tokens}
    for name, value in values.items():
        if value is not None and value != _DEFAULTS[name]:
            out[name] = value
    return out


def generate_request(
    body: CompletionRequest | ChatCompletionRequest,
    request_id: str,
    token_ids: list[int],
    sampling: SamplingParams,
) -> dict[str, Any]:
    """One rendered prompt as vLLM's GenerateRequest (every field, in vLLM's order)."""
    chat = isinstance(body, ChatCompletionRequest)
    parse_context = None
    if chat:
        assert isinstance(body, ChatCompletionRequest)
        parse_context = {
            "tools": body.tools,
            "tool_choice": body.tool_choice or ("auto" if body.tools else "none"),
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "include_reasoning": True,
            "chat_template_kwargs": body.chat_template_kwargs or {},
            "history_tool_call_cnt": 0,
        }
    return {
        "request_id": request_id,
        "token_ids": token_ids,
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": _sampling_params(body, sampling),
        "model": body.model,
        "reasoning_ended": None,
        "reasoning_parser_kwargs": None,
        "return_token_ids": body.return_token_ids,
        "output_mode": "tokens",
        "parse_context": parse_context,
        "stream": bool(body.stream),
        "stream_options": body.stream_options.model_dump()
        if body.stream and body.stream_options
        else None,
        "cache_salt": body.cache_salt,
        "priority": body.priority,
        "kv_transfer_params": body.kv_transfer_params,
        "ec_transfer_params": None,
    }
