"""Request state inside the engine: status, tokens, KV blocks held, timestamps, block hashes."""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import TYPE_CHECKING, NewType, TypeAlias

from mocker.disagg.params import RemotePrefill
from mocker.kv.hashing import BlockHash, BlockHashes, HashChain, Hasher

if TYPE_CHECKING:
    from mocker.kv.block import KVBlock

__all__ = [
    "EngineRequest",
    "FinishReason",
    "ParallelSampling",
    "Request",
    "RequestId",
    "RequestStatus",
    "SamplingParams",
    "TokenIds",
]

RequestId = NewType("RequestId", str)

# A request's token ids: a list, or an array('I') (replay's prompts: one buffer, not an int
# object per id, made and freed at C speed; see mocker.replay.prompts).
TokenIds: TypeAlias = MutableSequence[int]


class RequestStatus(IntEnum):
    """Ordered so that `status > PREEMPTED` means finished (as in vLLM)."""

    WAITING = 0
    WAITING_FOR_REMOTE_KVS = 1
    RUNNING = 2
    PREEMPTED = 3
    FINISHED_STOPPED = 4
    FINISHED_LENGTH_CAPPED = 5
    FINISHED_ABORTED = 6

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED


class FinishReason(StrEnum):
    """The OpenAI / vLLM finish_reason strings."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


FINISH_REASON_OF_STATUS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
}


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """The generation limits the engine honours (text-level stops are the API's job)."""

    max_tokens: int | None = None  # None: up to max_model_len
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()


@dataclass(slots=True, eq=False)
class ParallelSampling:
    """The engine requests one prompt fans out to for `n` choices (vLLM's ParentRequest):
    shared by them, so that the request-level figures (its n, its longest output) are
    observed once, when the last of them ends."""

    n: int
    # Children not yet ended: all n from the start, not counted as each engine takes its
    # child (siblings go to different data-parallel ranks, whose loops take them at their
    # own times: one could end before another is taken). A child that never reaches an
    # engine (its request refused, or aborted while queued) never ends: its request's
    # figures are then not observed.
    open: int = field(init=False)
    max_generation_tokens: int = 0

    def __post_init__(self) -> None:
        self.open = self.n

    def child_ended(self, num_generation_tokens: int) -> bool:
        """Count a child's end; True once it was the last one open."""
        self.max_generation_tokens = max(self.max_generation_tokens, num_generation_tokens)
        self.open -= 1
        return self.open == 0


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """What a driver hands the engine: an immutable description of one request."""

    request_id: str
    prompt_token_ids: Sequence[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = 0.0
    priority: int = 0  # lower runs first, as in vLLM's priority scheduling
    lora_name: str | None = None
    lora_path: str | None = None  # the adapter's path (vLLM hashes it with the name)
    cache_salt: str | None = None
    # vLLM 0.34's session id: related requests of one conversation (in its BlockStored).
    session_id: str | None = None
    # vLLM 0.34's kv_cache_report_mode (vllm_xargs): "full" announces the blocks it hits too.
    report_hits: bool = False
    # Replay: hashes of the prompt's leading full blocks, given by the driver (derived from
    # the trace's hash ids); the engine hashes only the blocks after them.
    block_hashes: Sequence[BlockHash] | None = None
    # P/D (NixlConnector): hold the KV for a decode engine when done (prefill side), or
    # pull the prompt's KV from the prefill engine that holds it (decode side).
    remote_decode: bool = False
    remote_prefill: RemotePrefill | None = None
    # n > 1: the siblings this request is one choice of (None: a request of its own).
    parent: ParallelSampling | None = None
    # Prompt logprobs asked for (or an echo with logprobs): as vLLM's, the request reads no
    # prefix hits (every prompt token is computed to score it); it still caches its blocks.
    skip_reading_prefix_cache: bool = False


@dataclass(slots=True, eq=False)
class Request:
    """Mutable per-request state, owned by the engine loop."""

    request_id: RequestId
    all_token_ids: TokenIds  # prompt then generated tokens
    num_prompt_tokens: int
    max_tokens: int  # resolved limit on generated tokens
    sampling: SamplingParams
    arrival_time: float
    priority: int = 0
    lora_name: str | None = None
    lora_path: str | None = None
    session_id: str | None = None  # (see EngineRequest)
    report_hits: bool = False  # (see EngineRequest)
    token_seed: int = 0
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    # KV blocks held, in token order; managed by the KV manager only. For a hybrid model,
    # group 0's table (position-indexed, None where released): only its length is read
    # outside the coordinator.
    blocks: list[KVBlock] = field(default_factory=list)
    # Hybrid models: every group's table (mocker.kv.coordinator), and the computed-token
    # count at which a group next releases a block (the scheduler then calls the manager
    # even if the tables have room).
    group_blocks: list[list[KVBlock | None]] | None = None
    kv_recheck: int = 1 << 62
    num_cached_blocks: int = 0  # leading blocks registered in the prefix cache
    block_hashes: BlockHashes = field(default_factory=list)
    num_cached_tokens: int = -1  # prefix-hit tokens at first admission (-1: not yet admitted)
    # Of those, the tokens loaded from each tier below the device: (tier name, tokens).
    tier_hits: tuple[tuple[str, int], ...] = ()
    # Hits of the admission whose KV is loading from the tiers (device, tiers), in tokens.
    load_hits: tuple[int, int] = (0, 0)
    # The blocks its own promotions brought to the CPU tier, by key, and the tier each came
    # from, until it loads (a run can come from several tiers, one promotion each).
    promoted: dict[BlockHash, str] | None = None
    skip_tier_load: bool = False  # a load or promotion failed: recompute from now on
    lookups_counted: bool = False  # its tier lookups are in the tiering counters
    # Hybrid models: where the prefix cached by full attention ends when a sparse group's
    # hit falls short (vLLM's shared_prefix_boundary, tokens; 0: none).
    shared_prefix_boundary: int = 0
    lora_wait: float = 0.0  # seconds its passes waited for LoRA adapters to load
    remote_decode: bool = False  # P/D prefill side: hold its KV for a pull when it finishes
    # P/D decode side: where its prompt's KV is (None once pulled, or after a failed pull:
    # then it recomputes).
    remote_prefill: RemotePrefill | None = None
    pull_time: float = 0.0  # seconds its KV took to pull (P/D decode side)
    num_preemptions: int = 0
    parent: ParallelSampling | None = None  # n > 1: its siblings (see EngineRequest)
    skip_reading_prefix_cache: bool = False  # (see EngineRequest)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float = 0.0  # when its latest output token was made
    finished_time: float | None = None
    # Its next output tokens drawn ahead (mocker.engine.stopping.draw): drawn[j] is token
    # drawn_from + j.
    drawn: list[int] | None = None
    drawn_from: int = 0
    # What hashes each block that fills (None: no prefix caching), and the block size it
    # hashes by: read by the core's per-token loop as well.
    hash_chain: HashChain | None = None
    hash_block_size: int = 16

    def enable_hashing(self, hasher: Hasher, block_size: int, cache_salt: str | None) -> None:
        """Hash the full blocks so far, and every block that fills from now on."""
        self.hash_chain = hasher.chain(self.lora_name, cache_salt, self.lora_path)
        self.hash_block_size = block_size
        self.hash_chain.extend(self.block_hashes, self.all_token_ids, block_size)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return list(self.all_token_ids[self.num_prompt_tokens :])

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> FinishReason | None:
        return FINISH_REASON_OF_STATUS.get(self.status)

    def append_output_tokens(self, token_ids: Sequence[int]) -> None:
        """Several tokens at once (the hashes of the blocks they fill, as one by one)."""
        tokens = self.all_token_ids
        before = len(tokens)
        tokens.extend(token_ids)
        chain, bs = self.hash_chain, self.hash_block_size
        if chain is not None and len(tokens) // bs > before // bs:
            chain.extend(self.block_hashes, tokens, bs)

    def append_output_token(self, token_id: int) -> None:
        tokens = self.all_token_ids
        tokens.append(token_id)
        chain = self.hash_chain
        if chain is not None and len(tokens) % self.hash_block_size == 0:
            chain.extend(self.block_hashes, tokens, self.hash_block_size)
