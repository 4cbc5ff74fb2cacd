"""Request intake: every check a request passes before an engine takes it, one wording each.

Pure functions of the engine config and the request, so the HTTP layer runs them in the
client's context (a 400) and the engine never holds a request it cannot serve.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from mocker.config import EngineConfig
from mocker.config_choices import SchedulingPolicy
from mocker.kv.hashing import extra_keys_bytes
from mocker.request import EngineRequest

__all__ = [
    "RequestRejected",
    "check_min_tokens",
    "check_prompt_length",
    "check_request",
    "request_id_in_use",
    "resolve_max_tokens",
]


class RequestRejected(ValueError):
    """A request the engine can never serve; the message says why (a client error).
    `param` names the request field at fault, when one is."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def request_id_in_use(request_id: str) -> RequestRejected:
    return RequestRejected(f"request id {request_id!r} is already in use")


def check_prompt_length(config: EngineConfig, num_tokens: int, param: str | None = None) -> None:
    """A prompt of max_model_len tokens or more leaves no room for a single output token."""
    if num_tokens >= config.scheduler.max_model_len:
        raise RequestRejected(
            f"This model's maximum context length is {config.scheduler.max_model_len} tokens. "
            "However, "
            f"your prompt contains {num_tokens} input tokens, leaving no room for the "
            "completion. Please reduce the length of the prompt.",
            param,
        )


def check_min_tokens(min_tokens: int, max_tokens: int) -> None:
    if min_tokens < 0:
        raise RequestRejected(f"min_tokens ({min_tokens}) must be >= 0.", "min_tokens")
    if min_tokens > max_tokens:
        raise RequestRejected(
            f"min_tokens ({min_tokens}) must be less than or equal to max_tokens ({max_tokens}).",
            "min_tokens",
        )


def _check_prompt_ids(prompt: Sequence[int]) -> int:
    try:
        n = len(array("I", prompt))  # C speed: every id an int in [0, 2^32), as hashing needs
    except (TypeError, OverflowError) as exc:
        raise RequestRejected(f"prompt token ids must be integers in [0, 2^32): {exc}") from None
    return n


def _resolve_max_tokens(config: EngineConfig, spec: EngineRequest, n: int) -> int:
    room = config.scheduler.max_model_len - n
    max_tokens = room if spec.sampling.max_tokens is None else spec.sampling.max_tokens
    if max_tokens < 1:
        raise RequestRejected(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
    if max_tokens > room:
        raise RequestRejected(
            f"This model's maximum context length is {config.scheduler.max_model_len} tokens. "
            "However, "
            f"you requested {n + max_tokens} tokens ({n} in the prompt, {max_tokens} in "
            "the completion).",
            "max_tokens",
        )
    return max_tokens


def _check_fits_the_pool(config: EngineConfig, n: int, max_tokens: int) -> None:
    # A request the pool can never hold would wait forever: refuse it now. Its peak is
    # n + max_tokens - 1 KV tokens: the last sampled token is never computed.
    # A hybrid model's groups share the pool: every group's blocks count.
    blocks = config.layout.max_blocks_per_request(
        n + max_tokens - 1,
        config.scheduler.max_num_batched_tokens,
        config.cache.enable_prefix_caching,
    )
    if blocks > config.cache.num_gpu_blocks:
        groups = f", {len(config.layout.groups)} KV cache groups" if config.is_hybrid else ""
        raise RequestRejected(
            f"the request needs up to {blocks} KV blocks ({n} prompt + {max_tokens} output "
            f"tokens at block_size {config.block_size}{groups}) but the KV cache has only "
            f"{config.cache.num_gpu_blocks} blocks (num_gpu_blocks); lower max_tokens",
            "max_tokens",
        )


def resolve_max_tokens(config: EngineConfig, spec: EngineRequest) -> int:
    """The max_tokens of a request that passed `check_request` (its prompt is known good)."""
    return _resolve_max_tokens(config, spec, len(spec.prompt_token_ids))


def check_request(config: EngineConfig, spec: EngineRequest, *, ids_in_range: bool = False) -> int:
    """Every check, changing nothing; returns the resolved max_tokens. (Whether the id is in
    use is the holder's to check: `request_id_in_use` words it.) `ids_in_range`: the driver
    built the prompt's ids itself, all ints in [0, 2^32) (replay's prompt builder), so they
    are only counted (checking them cost a twentieth of a replay)."""
    if spec.priority != 0 and config.scheduler.scheduling_policy is not SchedulingPolicy.PRIORITY:
        # vLLM's words (a ValueError there: a 400 that names no field)
        raise RequestRejected(
            f"Got priority {spec.priority} but Priority scheduling is not enabled."
        )
    n = len(spec.prompt_token_ids) if ids_in_range else _check_prompt_ids(spec.prompt_token_ids)
    if n == 0:
        raise RequestRejected("the prompt is empty: at least one token is needed")
    check_prompt_length(config, n)
    max_tokens = _resolve_max_tokens(config, spec, n)
    check_min_tokens(spec.sampling.min_tokens, max_tokens)
    _check_fits_the_pool(config, n, max_tokens)
    try:  # hashed into block keys inside the loop: a bad string must fail here, not there
        extra_keys_bytes(spec.lora_name, spec.cache_salt)
        spec.request_id.encode()
    except (UnicodeEncodeError, TypeError, AttributeError) as exc:
        raise RequestRejected(f"invalid request id, lora_name or cache_salt: {exc}") from None
    return max_tokens
