"""The `kv_transfer_params` of vLLM's NixlConnector: what a P/D request carries in, and what
a prefill engine answers with for the decode engine (vLLM 0.34's field lists)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mocker.kv.block import KVBlock, block_ids

if TYPE_CHECKING:
    from mocker.config import EngineConfig

__all__ = ["InvalidTransferParams", "RemotePrefill", "handoff_params", "parse_transfer_params"]

# The keys a decode engine needs to pull (vLLM indexes them directly).
_REQUIRED = ("remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host",
             "remote_port")  # fmt: skip


class InvalidTransferParams(ValueError):
    """A client's kv_transfer_params that no engine could act on (a 400)."""


@dataclass(frozen=True, slots=True)
class RemotePrefill:
    """A decode request's source: the prefill engine holding its prompt's KV, and where."""

    engine_id: str
    request_id: str  # the prefill engine's id of the request
    block_ids: tuple[int, ...]
    host: str
    port: int
    cached_tokens: int | None = None  # the prefill's prefix hits (vLLM reports them)
    transfer_mode: str = "pull"  # the prefill engine's connector: pull or push


def parse_transfer_params(params: Any) -> tuple[bool, RemotePrefill | None]:
    """(do_remote_decode, the remote prefill to pull from) of a request's kv_transfer_params.
    Keys this mock does not use pass; a `do_remote_prefill` without a complete set of
    remote keys is refused (vLLM logs "Got invalid KVTransferParams" and ignores them, or
    fails an assertion when the block ids are missing: a client error either way)."""
    if params is None:
        return False, None
    if not isinstance(params, Mapping):
        raise InvalidTransferParams("kv_transfer_params must be an object")
    remote_decode = params.get("do_remote_decode")
    remote_prefill = params.get("do_remote_prefill")
    for key, value in (("do_remote_decode", remote_decode),
                       ("do_remote_prefill", remote_prefill)):  # fmt: skip
        if value is not None and not isinstance(value, bool):
            raise InvalidTransferParams(f"kv_transfer_params.{key} must be true or false")
    if remote_decode and remote_prefill:
        raise InvalidTransferParams(
            "kv_transfer_params: do_remote_decode and do_remote_prefill are both true; a "
            "request is either the prefill or the decode half"
        )
    if not remote_prefill:
        return bool(remote_decode), None
    missing = [k for k in _REQUIRED if params.get(k) is None]
    if missing:
        raise InvalidTransferParams(
            "kv_transfer_params with do_remote_prefill needs " + ", ".join(missing)
        )
    return False, RemotePrefill(
        engine_id=_string(params, "remote_engine_id"),
        request_id=_string(params, "remote_request_id"),
        block_ids=_block_ids(params["remote_block_ids"]),
        host=_string(params, "remote_host"),
        port=_port(params["remote_port"]),
        cached_tokens=_count(params.get("remote_prefill_cached_tokens")),
        transfer_mode=_mode(params.get("transfer_mode", "pull")),
    )


def _mode(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidTransferParams("kv_transfer_params.transfer_mode must be a string")
    return value


def _string(params: Mapping[str, Any], key: str) -> str:
    value = params[key]
    if not isinstance(value, str) or not value:
        raise InvalidTransferParams(f"kv_transfer_params.{key} must be a non-empty string")
    return value


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise InvalidTransferParams("kv_transfer_params.remote_port must be a port number")
    return value


def _count(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidTransferParams(
            "kv_transfer_params.remote_prefill_cached_tokens must be an integer >= 0"
        )
    return value


def _block_ids(value: Any) -> tuple[int, ...]:
    """vLLM sends one list per KV cache group ([[3, 4, 5]]); a flat list is accepted too."""
    if not isinstance(value, list | tuple) or not value:
        raise InvalidTransferParams("kv_transfer_params.remote_block_ids must be a non-empty list")
    flat: list[Any] = []
    for item in value:
        flat.extend(item if isinstance(item, list | tuple) else [item])
    if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in flat):
        raise InvalidTransferParams(
            "kv_transfer_params.remote_block_ids must hold block ids (integers >= 0)"
        )
    return tuple(flat)


def handoff_params(
    config: EngineConfig,
    hold_id: str,
    host: str,
    port: int,
    *,
    blocks: Iterable[KVBlock | int],
    num_computed_tokens: int,
    num_cached_tokens: int,
) -> dict[str, Any]:
    """What a prefill engine answers for a held request (its blocks, computed tokens and
    prefix hits: negative when unknown): the keys and order of vLLM 0.34's
    NixlPullConnector.request_finished (NixlPushConnector's has no expiry time nor
    registration generation), plus `remote_prefill_cached_tokens` (its scheduler adds the
    prefill's prefix hits). `remote_request_id` is the hold's id (unique, as vLLM's
    internal request ids are)."""
    params: dict[str, Any] = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [block_ids(blocks)],
        "remote_engine_id": config.transfer.kv_engine_id,
        "remote_request_id": hold_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": 1,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": num_computed_tokens,
    }
    if config.transfer.kv_transfer_mode == "pull":
        params["remote_blocks_expiry_time"] = None
        params["remote_registration_generation"] = 0
    params["transfer_mode"] = config.transfer.kv_transfer_mode
    params["remote_prefill_cached_tokens"] = max(num_cached_tokens, 0)
    return params
