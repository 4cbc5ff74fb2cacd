"""vLLM v1 scheduling pass: running first, then waiting, one budget, preemption by recompute."""

from __future__ import annotations

from collections.abc import Callable, Sized
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING

from mocker.config import EngineConfig, KVRole, PreemptionVictim, SchedulingPolicy
from mocker.kv.manager import KVManager
from mocker.request import Request, RequestStatus
from mocker.scheduler.waiting_queue import WaitingQueue

if TYPE_CHECKING:
    from mocker.disagg.pulls import RemotePulls
    from mocker.tiers.connector import TierConnector

__all__ = ["DecodeHead", "Scheduler", "SchedulerOutput", "decodes_next"]

# (running, start, budget, scheduled, allocate) -> (index, budget, decodes): see
# Scheduler.decode_head.
DecodeHead = Callable[
    [list[Request], int, int, dict[Request, int], Callable[[Request, int], bool]],
    tuple[int, int, int],
]

_TOKEN_IDS = attrgetter("all_token_ids")


@dataclass(slots=True)
class SchedulerOutput:
    """One pass: tokens to compute per request, and what changed to make room."""

    num_scheduled: dict[Request, int] = field(default_factory=dict)
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    # Tier loads to start: (request, first block, number of blocks); the device slots
    # are reserved and the request waits for its KV (WAITING_FOR_REMOTE_KVS).
    loads: list[tuple[Request, int, int]] = field(default_factory=list)
    # P/D pulls to start: (request, number of blocks); the device slots are reserved.
    pulls: list[tuple[Request, int]] = field(default_factory=list)
    # Pass composition, for the timing model: a decode computes the last sampled token and
    # reads every token before it; a prefill chunk reads the tokens before it.
    num_prefill_tokens: int = 0
    num_decodes: int = 0
    prefill_requests: int = 0
    prefill_context: int = 0
    decode_context: int = 0  # summed only when `Scheduler.count_context` (else 0)
    # Prefix-cache accounting of the requests admitted in this pass (tokens).
    prefix_queries: int = 0
    prefix_hits: int = 0
    external_queries: int = 0  # with tiers below the device: prompt tokens queried there
    external_hits: int = 0  # of which loaded from them
    # Of those, the tokens each tier supplied (None until one did).
    external_by_tier: dict[str, int] | None = None
    # Requests whose blocks this pass computes were registered in the prefix cache as they
    # were scheduled (vLLM's allocate_slots caches them before the forward pass, so a
    # request admitted later in the same pass hits them): how many blocks each had
    # registered before, for the store policy at the pass's end.
    # (None until one is: most passes register nothing)
    registered: dict[Request, int] | None = None


def decodes_next(request: Request) -> bool:
    """The request's next pass computes only its last sampled token (it is past its prompt)."""
    num_tokens = len(request.all_token_ids)
    return request.num_computed_tokens == num_tokens - 1 and num_tokens > request.num_prompt_tokens


def _is_decode(request: Request, num_new: int) -> bool:
    """A pass computes one token of this request: the last one it sampled (before the pass)."""
    return num_new == 1 and decodes_next(request)


def _priority_key(request: Request) -> tuple[int, float]:
    return request.priority, request.arrival_time


class Scheduler:
    """Decides each pass; allocates through the KV manager, never touches the pool directly,
    and asks the connector (if tiers are below the device) what they hold."""

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
        self._by_priority = config.scheduling_policy is SchedulingPolicy.PRIORITY
        self.waiting = WaitingQueue(by_arrival=self._by_priority)
        # Tiers: requests waiting for their KV to load, and those whose KV has landed,
        # which resume ahead of fresh admissions.
        self.loading: set[Request] = set()
        self.ready: list[Request] = []
        self.num_deferred = 0  # waiting requests the last pass passed over (LoRA, promotion)
        # Prefix counts of loads that ended between passes, reported by the next pass.
        self._carry = SchedulerOutput()
        self.num_preemptions = 0
        self._token_budget = config.max_num_batched_tokens
        # vLLM's long_prefill_token_threshold: no chunk longer (0: no cap but the budget's).
        self._long = config.long_prefill_token_threshold or config.max_num_batched_tokens
        self._max_seqs = config.max_num_seqs
        self._chunked = config.enable_chunked_prefill
        self._victim = config.preemption_victim
        self._block_size = config.block_size
        # Mamba layers saving states for prefix caching (vLLM's mamba_cache_mode "align"):
        # prefill chunks end on block boundaries, where states are saved.
        self._mamba_split = config.layout.has_mamba and config.enable_prefix_caching
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
        self._external = connector is not None or config.kv_role is not KVRole.NONE
        # vLLM's LoRA rule: at most this many distinct adapters in a batch (0: no LoRA).
        self._max_loras = config.max_loras if config.enable_lora else 0
        # decode_head(running, start, budget, scheduled, allocate) -> (index, budget,
        # decodes): the compiled head of `_schedule_running` (mocker/engine/_cpass.c), set by
        # the engine when its KV manager's failed allocations change nothing; None: the
        # loop below does it all.
        self.decode_head: DecodeHead | None = None
        # Sum the decodes' context lengths (SchedulerOutput.decode_context): only a timing
        # model that reads them asks (the engine sets this).
        self.count_context = False

    # -- queue changes ------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.push(request)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """End a request wherever it is and free its blocks at once (a load it waits for
        must have been cancelled first)."""
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            self.loading.discard(request)
        elif not self.waiting.remove(request) and request in self.ready:
            self.ready.remove(request)
        request.status = status
        self.free_finished(request)

    def free_finished(self, request: Request) -> None:
        """Release a finished request's blocks: now, or (write-through) when the connector's
        copies of them have ended (vLLM's request_finished → delay_free)."""
        connector = self.connector
        if connector is not None and connector.request_finished(request):
            request.num_cached_blocks = 0
            return
        self.kv.free(request)

    def resume(self, request: Request) -> None:
        """Its KV loaded: it computes the rest of its prompt before fresh admissions. Its
        hits count now (whatever happens to the loaded blocks before it resumes)."""
        self.loading.discard(request)
        request.status = RequestStatus.WAITING
        self.ready.append(request)
        device, tiers = request.load_hits
        self._count_prefix(request, device, tiers, self._carry)

    def requeue(self, request: Request) -> None:
        """Its load was dropped (timeout) and its blocks freed: it waits again, in front."""
        self.loading.discard(request)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        self.waiting.push_front(request)

    @property
    def num_waiting(self) -> int:
        """As vLLM counts: requests waiting for KV to load are waiting too."""
        return len(self.waiting) + len(self.loading) + len(self.ready)

    def remove_finished(self) -> None:
        """Drop finished requests from the running list (once per pass, O(running))."""
        last_unfinished = RequestStatus.PREEMPTED  # RequestStatus.is_finished, inlined
        self.running = [r for r in self.running if r.status <= last_unfinished]

    # -- the pass -----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out, carry = SchedulerOutput(), self._carry
        if carry.prefix_queries:
            out.prefix_queries, out.prefix_hits = carry.prefix_queries, carry.prefix_hits
            out.external_queries, out.external_hits = carry.external_queries, carry.external_hits
            # (Zeroed in place: only these counts of the carry are ever set.)
            carry.prefix_queries = carry.prefix_hits = 0
            carry.external_queries = carry.external_hits = 0
            out.external_by_tier, carry.external_by_tier = carry.external_by_tier, None
        budget, stalled = self._schedule_running(self._token_budget, out)
        # As vLLM: a pass that had to preempt admits nobody new (unless nothing is left to
        # run). Nor does one in which a running request waits for blocks being offloaded:
        # they are its when they land.
        if not stalled and (not out.preempted or not out.num_scheduled):
            budget = self._schedule_ready(budget, out)
            self._schedule_waiting(budget, out)
        while not out.num_scheduled and not self.running and not out.loads and self._unblock():
            budget = self._schedule_ready(budget, out)
            self._schedule_waiting(budget, out)
        return out

    def decode_batch(self) -> list[Request] | None:
        """The running requests, if the next pass can only be each of them decoding one
        token: nothing waits to be admitted or resumed, and every one is past its prompt.
        None otherwise. (Whether the pool has room for their next blocks is the caller's
        to check: without it, `schedule()` preempts.)"""
        running = self.running
        if (
            not running
            or self.waiting
            or self.ready
            or self.loading
            or self._carry.prefix_queries
            or len(running) > self._token_budget
        ):
            return None
        # Newest first: a request still in its prompt is most often the last admitted.
        for request in reversed(running):
            num_tokens = len(request.all_token_ids)
            if (
                request.num_computed_tokens != num_tokens - 1
                or num_tokens <= request.num_prompt_tokens
            ):
                return None
        return running

    def schedule_after_decodes(self, num_decodes: int) -> SchedulerOutput:
        """`schedule()` for a pass whose first `num_decodes` running requests each decode one
        token (see `decodes_next`) and already hold the blocks for it, their caller having
        allocated them in running order as `_schedule_running` would have: the rest of the
        running requests and the admissions, with the budget left. The decoders are counted,
        not listed in `num_scheduled`. (Nothing may be waiting to resume: see
        `resumes_pending`.)"""
        out = SchedulerOutput(num_decodes=num_decodes)
        budget, stalled = self._schedule_running(self._token_budget - num_decodes, out,
                                                 num_decodes)  # fmt: skip
        if not stalled and (not out.preempted or not out.num_scheduled):
            budget = self._schedule_ready(budget, out)
            self._schedule_waiting(budget, out)
        return out

    @property
    def resumes_pending(self) -> bool:
        """Requests wait for their KV to load or to resume, or a pass is still to report the
        prefix counts of loads that ended: `schedule()` has more to do than run and admit."""
        return bool(self.ready or self.loading or self._carry.prefix_queries)

    def _unblock(self) -> bool:
        """Requests with loaded KV hold blocks while they wait to resume. If none can resume,
        nothing runs, and no device block is on its way back, the newest gives its blocks
        back (they stay cached on the device) and waits again, so the others can go on.
        It is not admitted again before they have all resumed (`_schedule_waiting`)."""
        if not self.ready or self._blocks_in_flight():
            return False
        request = self.ready.pop()
        self.kv.free(request)
        request.num_computed_tokens = 0
        self.waiting.push_front(request)
        return True

    def _blocks_in_flight(self) -> bool:
        """Device blocks that transfers in flight will hand back, or may: displaced blocks
        being copied out (write-back), blocks pinned by their copy to the CPU tier
        (write-through), slots reserved by loads (one that times out frees them). Not
        promotions or cascades, which hold no device block: waiting for those would let a
        promotion that keeps being retried keep every loaded request from ever resuming."""
        connector = self.connector
        if self.kv.awaiting_displaced or self.pulls:
            return True  # a pull that fails frees its slots
        return connector is not None and bool(
            connector.num_loading or connector.policy.has_staged or connector.stores_in_flight
        )

    def _schedule_running(
        self, budget: int, out: SchedulerOutput, start: int = 0
    ) -> tuple[int, bool]:
        # (From running request `start` on: those before it are the caller's, as in
        # `schedule_after_decodes`.)
        running = self.running
        scheduled = out.num_scheduled
        allocate = self.kv.allocate_slots
        bs = self._block_size
        longest = self._long
        prefill = decodes = prefill_reqs = prefill_ctx = decode_ctx = 0
        stalled = False
        chunks: list[tuple[Request, int]] | None = None  # prefill chunks that fill blocks
        i = start
        if self.decode_head is not None and not self._mamba_split:
            # The requests that decode one token, from the head on, in C: as this loop
            # schedules them (it goes on from the first that does not, or finds no room).
            i, budget, decodes = self.decode_head(running, i, budget, scheduled, allocate)
            if self.count_context and i > start:
                decode_ctx = sum(map(len, map(_TOKEN_IDS, running[start:i])))
        while i < len(running) and budget > 0:
            request = running[i]
            num_tokens = len(request.all_token_ids)
            computed = request.num_computed_tokens
            num_new = num_tokens - computed
            if num_new > budget:
                num_new = budget
            if num_new > longest:
                num_new = longest
            if self._mamba_split:
                num_new = self._mamba_aligned(request, computed, num_new)
                if not num_new:
                    i += 1  # it waits for a pass with room to reach the next boundary
                    continue
            # Most decode steps stay inside the last block: skip the allocator then (unless
            # a hybrid model's group releases a block now).
            if computed + num_new > len(request.blocks) * bs or computed >= request.kv_recheck:
                room = True
                while not allocate(request, num_new):
                    if self.kv.awaiting_displaced:
                        # Blocks are on their way back from copies to the CPU tier: wait
                        # for them rather than preempt (no capacity exists before then).
                        room = False
                        break
                    victim = self._pick_victim()
                    index = running.index(victim)
                    if victim in scheduled:  # only when the victim runs before `request`
                        n = scheduled.pop(victim)
                        budget += n
                        if _is_decode(victim, n):
                            decodes -= 1
                            decode_ctx -= len(victim.all_token_ids)
                        else:
                            prefill -= n
                            prefill_reqs -= 1
                            prefill_ctx -= victim.num_computed_tokens
                    self._preempt(victim, out)
                    if victim is request:
                        break
                    if index < i:
                        i -= 1
                if request.status != RequestStatus.RUNNING:
                    continue  # it was its own victim; the next request is now at index i
                if not room:
                    stalled = True
                    i += 1
                    continue  # it sits this pass out
            scheduled[request] = num_new
            budget -= num_new
            # _is_decode, inlined (once per running request per pass): `computed` is still
            # the request's, as allocation changed none of its counts.
            if (
                num_new == 1
                and computed == num_tokens - 1
                and num_tokens > request.num_prompt_tokens
            ):
                decodes += 1
                decode_ctx += num_tokens
            else:
                prefill += num_new
                prefill_reqs += 1
                prefill_ctx += computed
                if (computed + num_new) // bs > request.num_cached_blocks:
                    if chunks is None:
                        chunks = []
                    chunks.append((request, computed + num_new))
            i += 1
        out.num_prefill_tokens += prefill
        out.num_decodes += decodes
        out.prefill_requests += prefill_reqs
        out.prefill_context += prefill_ctx
        if self.count_context:
            out.decode_context += decode_ctx
        # Prefill chunks register their blocks once every running request is placed: a
        # victim of the priority policy or of --preemption-victim oldest may have been
        # scheduled earlier in this loop (no lookup happens before the loop ends, so the
        # requests admitted after it hit the same blocks).
        if chunks is not None:
            for request, num_tokens in chunks:
                if request in scheduled:
                    self._register(request, num_tokens, out)
        return budget, stalled

    def _mamba_aligned(self, request: Request, start: int, num_new: int) -> int:
        """vLLM's _mamba_block_aligned_split: a prefill chunk ends on a block boundary (its
        Mamba state is saved there), never runs past the last boundary before the prompt's
        end (the state a later prompt with this prefix can hit) nor past a prefix other
        requests share, and one that starts mid-block stops at the next boundary. The
        prompt's last chunk is exempt."""
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        if start >= prefill_end:
            return num_new
        bs = self._block_size
        end = start + num_new
        if end < prefill_end:
            aligned = end // bs * bs
            if aligned > start or bs <= self._token_budget:
                end = aligned
        last_cache = (request.num_tokens - 1) // bs * bs
        chunk = self._chunk
        next_chunk = (start // chunk + 1) * chunk if chunk else 0
        # The shared-prefix junction (block-floored): its state saved, later requests that
        # share the prefix hit it (vLLM's Marconi-style stop).
        junction = request.shared_prefix_boundary
        shared = start + (junction - start) // bs * bs if start < junction < end else 0
        for stop in ((start // bs + 1) * bs if start % bs else 0, last_cache, next_chunk, shared):
            if start < stop < end:
                end = stop
        return max(end - start, 0)

    def _chunk_aligned_lookup(self, request: Request, hits: Sized) -> tuple[Sized, int | None]:
        """A hybrid model's device hit that ends inside a tier chunk: the longest hit valid in
        every group up to the chunk boundary before it, continued by the tier if together
        they reach past the device hit (the rest is recomputed); else the device hit alone
        (and the tier forgets what it kept for the request). None: retry later."""
        connector, unit = self.connector, self._unit
        assert connector is not None
        cut = self.kv.get_computed_blocks(request, len(hits) // unit * unit)
        if len(cut) % unit:
            connector.skip_lookup(request)
            return hits, 0
        matched = connector.num_matched_blocks(request, len(cut) // unit)
        if matched is None or len(cut) + matched * unit > len(hits):
            return cut, matched
        connector.skip_lookup(request)
        return hits, 0

    def _pick_victim(self) -> Request:
        """vLLM's victim: under the priority policy the running request with the highest
        (priority, arrival time), the first such in running order; under fcfs (every
        priority 0) the newest running (`running.pop()`), or with --preemption-victim
        oldest the oldest."""
        running = self.running
        if self._by_priority:
            return max(running, key=_priority_key)
        if self._victim is PreemptionVictim.OLDEST:
            return running[0]
        return running[-1]

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        """Preemption by recompute: free everything, start over from the front of waiting."""
        self.running.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.push_front(request)
        out.preempted.append(request)

    def preempt_running(self) -> SchedulerOutput:
        """vLLM's reset_running_requests: every running request preempted (recomputed when
        it runs again), the last first, so that they wait in their order."""
        out = SchedulerOutput()
        while self.running:
            self._preempt(self.running[-1], out)
        return out

    def _admit(self, request: Request, num_new: int, out: SchedulerOutput) -> None:
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        out.admitted.append(request)
        out.num_scheduled[request] = num_new
        out.num_prefill_tokens += num_new
        out.prefill_requests += 1
        out.prefill_context += request.num_computed_tokens
        self._register(request, request.num_computed_tokens + num_new, out)

    def _register(self, request: Request, num_tokens: int, out: SchedulerOutput) -> None:
        """Register the full blocks this pass computes for the request now, as vLLM's
        allocate_slots does before the forward pass: a request scheduled after it in this
        pass with the same prefix (another choice of n, a burst of one system prompt) hits
        them rather than computing them again."""
        kv = self.kv
        if not kv.enable_caching:
            return  # (the pass's end counts the blocks, as it always did)
        before = request.num_cached_blocks
        kv.cache_blocks(request, min(num_tokens, request.num_tokens))
        if request.num_cached_blocks > before:
            if out.registered is None:
                out.registered = {}
            out.registered.setdefault(request, before)

    def _count_prefix(
        self, request: Request, device: int, tiers: int, out: SchedulerOutput
    ) -> None:
        """Prefix-cache accounting, once per request: at its first admission (what each tier
        contributed is in `request.tier_hits`, set by the connector when the load started)."""
        if request.num_cached_tokens >= 0:
            return
        request.num_cached_tokens = device + tiers
        out.prefix_queries += request.num_tokens
        out.prefix_hits += device
        if self._external:
            out.external_queries += request.num_tokens
            out.external_hits += tiers
            if tiers:
                by_tier = out.external_by_tier
                if by_tier is None:
                    by_tier = out.external_by_tier = {}
                for tier, n in request.tier_hits:
                    by_tier[tier] = by_tier.get(tier, 0) + n

    def _schedule_ready(self, budget: int, out: SchedulerOutput) -> int:
        """Resume requests whose KV loaded, in the order their loads ended."""
        ready = self.ready
        if not ready:
            return budget
        loras = self._batch_loras()
        i = 0
        while i < len(ready) and budget > 0 and len(self.running) < self._max_seqs:
            request = ready[i]
            lora = request.lora_name
            if self._over_max_loras(loras, lora):
                i += 1  # its adapter waits for a slot; the next resumes (as in waiting)
                continue
            num_new = min(request.num_tokens - request.num_computed_tokens, self._long)
            if num_new > budget:
                if not self._chunked:
                    break
                num_new = budget
            if self._mamba_split:
                num_new = self._mamba_aligned(request, request.num_computed_tokens, num_new)
                if not num_new:
                    break
            if not self.kv.allocate_slots(request, num_new):
                break
            ready.pop(i)
            self._admit(request, num_new, out)
            budget -= num_new
            if loras is not None and lora is not None:
                loras.add(lora)
        return budget

    def _over_max_loras(self, loras: set[str] | None, lora: str | None) -> bool:
        """Admitting a request for `lora` would put more than max_loras adapters in the batch."""
        return (
            loras is not None
            and lora is not None
            and lora not in loras
            and len(loras) >= self._max_loras
        )

    def _batch_loras(self) -> set[str] | None:
        """The adapters of the running requests (None: LoRA is off)."""
        if not self._max_loras:
            return None
        return {r.lora_name for r in self.running if r.lora_name is not None}

    def _schedule_waiting(self, budget: int, out: SchedulerOutput) -> None:
        """Admit waiting requests in order, starting loads for those a tier holds. None while
        a request whose KV loaded still waits to resume: it comes first (vLLM stops at the
        first waiting request it cannot allocate), and a fresh admission would take the
        blocks it waits for, among them those `_unblock` just freed for it."""
        self.num_deferred = 0
        if self.ready:
            loras = self._batch_loras()
            if any(not self._over_max_loras(loras, r.lora_name) for r in self.ready):
                return
            # Every one of them waits for an adapter slot: the queue goes on (as vLLM's).
        waiting = self.waiting
        kv, connector = self.kv, self.connector
        bs = kv.block_size
        unit = self._unit
        skipped: list[tuple[Request, int]] = []
        loras = self._batch_loras()
        while budget > 0 and len(self.running) < self._max_seqs and waiting:
            request = waiting.peek()
            assert request is not None
            lora = request.lora_name
            if self._over_max_loras(loras, lora):
                # Its adapter would exceed max_loras: it waits, keeping its place, and the
                # requests behind it go on (vLLM skips it, not the queue).
                skipped.append(waiting.pop_entry())
                continue
            hits = kv.get_computed_blocks(request)
            num_hit = len(hits) * bs
            if request.remote_prefill is not None and self.pulls is not None:
                # P/D decode side: the rest of the prompt is pulled from the prefill engine
                # (all of it, as vLLM's NixlConnector; a local hit is not pulled again).
                num_pulled = request.num_prompt_tokens - num_hit
                if not kv.allocate_slots(request, num_pulled, hits):
                    break
                waiting.pop()
                request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                request.load_hits = (num_hit, num_pulled)
                self.loading.add(request)
                out.pulls.append((request, len(request.blocks) - len(hits)))
                continue
            num_loaded = 0  # tier units (blocks; a hybrid model's chunks of `unit` blocks)
            # (prompt logprobs: no hit from the tiers either, their tokens are computed)
            if connector is not None and not request.skip_reading_prefix_cache:
                if len(hits) % unit:
                    # A hybrid device hit that ends inside a chunk: the tier continues from a
                    # chunk boundary, so the hit is cut back to one if that gains tokens.
                    hits, matched = self._chunk_aligned_lookup(request, hits)
                    num_hit = len(hits) * bs
                else:
                    matched = connector.num_matched_blocks(request, len(hits) // unit)
                if matched is None:
                    # Retry later (its KV is being promoted to the CPU tier): it keeps its
                    # place, and the requests behind it go on (vLLM skips it this pass).
                    skipped.append(waiting.pop_entry())
                    continue
                num_loaded = matched
            if num_loaded:
                # Reserve device slots for the tier's blocks and park the request until its
                # KV has loaded; it needs no budget until then.
                loaded_tokens = num_loaded * unit * bs
                if not kv.allocate_slots(request, loaded_tokens, hits, loaded=True):
                    break
                waiting.pop()
                request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                request.load_hits = (num_hit, loaded_tokens)
                self.loading.add(request)
                out.loads.append((request, len(hits) // unit, num_loaded))
                continue
            num_new = min(request.num_tokens - num_hit, self._long)
            if num_new > budget:
                if not self._chunked:
                    break  # the whole prompt waits for a pass with room for it
                num_new = budget
            if self._mamba_split:
                num_new = self._mamba_aligned(request, num_hit, num_new)
                if not num_new:
                    break
            if not kv.allocate_slots(request, num_new, hits):
                break
            waiting.pop()
            self._count_prefix(request, num_hit, 0, out)
            request.num_computed_tokens = num_hit
            self._admit(request, num_new, out)
            budget -= num_new
            if loras is not None and lora is not None:
                loras.add(lora)
        self.num_deferred = len(skipped)
        for request, order in skipped:
            waiting.restore(request, order)
