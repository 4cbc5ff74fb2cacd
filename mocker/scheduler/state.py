"""The scheduler's state, which the pass's parts (sibling modules) read and change."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mocker.config import EngineConfig
from mocker.config_choices import KVRole, SchedulingPolicy
from mocker.kv.manager import KVManager
from mocker.request import Request
from mocker.scheduler.output import SchedulerOutput
from mocker.scheduler.waiting_queue import WaitingQueue

if TYPE_CHECKING:
    from mocker.disagg.pulls import RemotePulls
    from mocker.tiers.connector import TierConnector

__all__ = ["DecodeHead", "SchedulerState"]

# (running, start, budget, scheduled, allocate) -> (index, budget, decodes): see
# SchedulerState.decode_head.
DecodeHead = Callable[
    [list[Request], int, int, dict[Request, int], Callable[[Request, int], bool]],
    tuple[int, int, int],
]


class SchedulerState:
    """The scheduler's queues, budget settings, KV manager and connector."""

    # The pass's parts are functions in the sibling modules (running, admission, preemption,
    # deferral, ...) taking this state: they read its `_` settings, which are this package's,
    # not its callers'. (Plain functions, not methods on helper objects: the hot loops call
    # them with no more indirection than a method call.)
    __slots__ = (
        "_block_size",
        "_by_priority",
        "_carry",
        "_chunk",
        "_chunked",
        "_external",
        "_long",
        "_mamba_split",
        "_max_loras",
        "_max_seqs",
        "_token_budget",
        "_unit",
        "_victim",
        "connector",
        "count_context",
        "decode_head",
        "kv",
        "loading",
        "num_deferred",
        "num_preemptions",
        "pulls",
        "ready",
        "running",
        "waiting",
    )

    def __init__(
        self,
        config: EngineConfig,
        kv: KVManager,
        connector: TierConnector | None = None,
        pulls: RemotePulls | None = None,
    ) -> None:
        self.kv = kv
        self.connector = connector
        self.pulls = pulls  # P/D decode side: prompts whose KV a prefill engine holds
        self.running: list[Request] = []
        self._by_priority = config.scheduler.scheduling_policy is SchedulingPolicy.PRIORITY
        self.waiting = WaitingQueue(by_arrival=self._by_priority)
        # Tiers: requests waiting for their KV to load, and those whose KV has landed,
        # which resume ahead of fresh admissions.
        self.loading: set[Request] = set()
        self.ready: list[Request] = []
        self.num_deferred = 0  # waiting requests the last pass passed over (LoRA, promotion)
        # Prefix counts of loads that ended between passes, reported by the next pass.
        self._carry = SchedulerOutput()
        self.num_preemptions = 0
        self._token_budget = config.scheduler.max_num_batched_tokens
        # vLLM's long_prefill_token_threshold: no chunk longer (0: no cap but the budget's).
        self._long = (
            config.scheduler.long_prefill_token_threshold or config.scheduler.max_num_batched_tokens
        )
        self._max_seqs = config.scheduler.max_num_seqs
        self._chunked = config.scheduler.enable_chunked_prefill
        self._victim = config.scheduler.preemption_victim
        self._block_size = config.block_size
        # Mamba layers saving states for prefix caching (vLLM's mamba_cache_mode "align"):
        # prefill chunks end on block boundaries, where states are saved.
        self._mamba_split = config.layout.has_mamba and config.cache.enable_prefix_caching
        # Device blocks per tier unit (a hybrid model's offload chunk), and (hybrid offload
        # with Mamba groups) the chunk in tokens: prefill chunks stop at each chunk's end
        # too, so that a state is saved there and the chunk can be stored.
        self._unit = config.unit_blocks
        self._chunk = (
            config.block_size * config.unit_blocks
            if self._mamba_split and config.has_cpu_tier
            else 0
        )
        # A KV connector answers lookups (tiers, or P/D: a prefill engine's answers 0): its
        # queries and hits are counted (vLLM's external_prefix_cache_*).
        self._external = connector is not None or config.transfer.kv_role is not KVRole.NONE
        # vLLM's LoRA rule: at most this many distinct adapters in a batch (0: no LoRA).
        self._max_loras = config.lora.max_loras if config.lora.enable_lora else 0
        # decode_head(running, start, budget, scheduled, allocate) -> (index, budget,
        # decodes): the compiled head of `schedule_running` (mocker/engine/_cpass.c), set by
        # the engine when its KV manager's failed allocations change nothing; None: that
        # function's loop does it all.
        self.decode_head: DecodeHead | None = None
        # Sum the decodes' context lengths (SchedulerOutput.decode_context): only a timing
        # model that reads them asks (the engine sets this).
        self.count_context = False
