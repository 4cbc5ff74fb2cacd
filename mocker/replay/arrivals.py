"""A replay's arrivals: the trace cursor, routing, closed-loop users and P/D decode legs."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import replace

from mocker.config import EngineConfig
from mocker.config_choices import KVRole
from mocker.disagg.local_peers import LocalPeers
from mocker.disagg.params import RemotePrefill, parse_transfer_params
from mocker.engine.core import EngineCore
from mocker.engine.event_loop import EventLoop
from mocker.engine.intake import RequestRejected, check_prompt_length
from mocker.engine.kv_stack import build_shared_tiers
from mocker.engine.stats import FinishedRequestStats
from mocker.kv.hashing import BlockHashes
from mocker.replay.prompts import PromptBuilder, adapter_hashes
from mocker.replay.records import ReplayResult, RequestRecord
from mocker.replay.router import RoutingPolicy, make_router
from mocker.replay.trace import TraceRequest
from mocker.request import EngineRequest, SamplingParams, TokenIds
from mocker.timing import TimingModel

__all__ = ["TraceArrivals"]


def _cores(
    config: EngineConfig, num_engines: int, prefill_engines: int, timing: TimingModel | None
) -> list[EngineCore]:
    """The engines, sharing one `obj` tier as one process's engines do; with P/D, the first
    `prefill_engines` are NixlConnector producers and the rest consumers pulling from them."""
    shared = build_shared_tiers(config)
    if not prefill_engines:
        return [EngineCore(config, timing=timing, shared_tiers=shared, engine_id=k)
                for k in range(num_engines)]  # fmt: skip
    producers: dict[str, EngineCore] = {}
    cores = []
    for k in range(num_engines):
        prefill = k < prefill_engines
        role = KVRole.PRODUCER if prefill else KVRole.CONSUMER
        name = f"{'prefill' if prefill else 'decode'}-{k}"
        engine_config = config.with_changes(kv_role=role, kv_engine_id=name)
        core = EngineCore(engine_config, timing=timing, shared_tiers=shared, engine_id=k,
                          peers=None if prefill else LocalPeers(producers))  # fmt: skip
        if prefill:
            producers[name] = core
        cores.append(core)
    return cores


class TraceArrivals:
    """The engines, fed the trace as the event loop's `Arrivals` (mocker.engine.event_loop)."""

    def __init__(
        self,
        trace: Sequence[TraceRequest],
        config: EngineConfig,
        num_engines: int,
        router: RoutingPolicy | str,
        trace_block_size: int,
        concurrency: int | None,
        prefill_engines: int,
        timing: TimingModel | None,
    ) -> None:
        self.trace = trace
        self.cores = _cores(config, num_engines, prefill_engines, timing)
        for core in self.cores:
            core.emit_outputs = False  # rows and samples come from the requests themselves
        self.num_prefill = prefill_engines
        self.max_model_len = config.scheduler.max_model_len
        self.loop = EventLoop(self.cores, self)
        self.pick = make_router(router).pick
        # P/D: the decode pool's router, and the decode legs due: (time, order, request id,
        # where its KV is), a heap; each request's prompt until its decode leg is sent.
        self.pick_decode = make_router(router).pick
        self.legs: list[tuple[float, int, str, RemotePrefill | None]] = []
        self.num_legs = 0
        self.prompts: dict[str, tuple[TraceRequest, TokenIds, BlockHashes]] = {}
        self.prefilled_on: dict[str, int] = {}
        self.builder = PromptBuilder(
            config.block_size, trace_block_size, config.output.vocab_size, config.seed
        )
        self.result = ReplayResult(cores=self.cores)
        # request id -> (trace line, engine, adapter)
        self.lines: dict[str, tuple[int, int, str | None]] = {}
        # Closed loop: when each idle user sends next (a heap; C zeros at the start).
        self.free_users: list[float] | None = None
        if concurrency is not None:
            # (More users than requests would only wait: none is made.)
            self.free_users = [0.0] * min(concurrency, len(trace))
        self.i = 0  # the next trace request
        self.finished_count = 0

    def next_time(self) -> float | None:
        """The Arrivals protocol: the next trace request's arrival, or decode leg."""
        t = self._next_arrival()
        if self.legs:
            leg = self.legs[0][0]
            t = leg if t is None else min(t, leg)
        return t

    def apply(self, now: float) -> None:
        if self.legs and self.legs[0][0] <= now:
            _, _, rid, remote = heapq.heappop(self.legs)
            self._send_decode(rid, remote, now)
        else:
            self._arrive(now)

    def _next_arrival(self) -> float | None:
        if self.i >= len(self.trace):
            return None
        if self.free_users is None:
            return self.trace[self.i].arrival
        # The next user to become free; none is when all wait for their requests.
        return self.free_users[0] if self.free_users else None

    def _arrive(self, arrival: float) -> None:
        """Route trace request i, arriving at `arrival`, and hand it to its engine."""
        item = self.trace[self.i]
        if self.free_users is not None:
            heapq.heappop(self.free_users)
            item = replace(item, arrival=arrival)
        rid = f"r{self.i}"
        self.i += 1
        if item.input_length >= self.max_model_len:
            # Refused as the engine refuses it, before a prompt of that length is built.
            try:
                check_prompt_length(self.cores[0].config, item.input_length)
            except RequestRejected as exc:
                self._rejected(rid, item, 0, exc)
            return
        tokens, hashes = self.builder.prompt(item)
        if item.lora is not None:  # an adapter's blocks are its own: no prefix crosses
            hashes = adapter_hashes(hashes, item.lora)
        pd = self.num_prefill > 0
        pool = self.cores[: self.num_prefill] if pd else self.cores
        target = self.pick(pool, hashes)
        core = self.cores[target]
        self.loop.wake(target, item.arrival)
        # P/D: the prefill leg, as vllm-router sends it (max_tokens 1, do_remote_decode).
        sampling = SamplingParams(max_tokens=1 if pd else item.output_length, ignore_eos=True)
        spec = EngineRequest(rid, tokens, sampling, item.arrival, lora_name=item.lora,
                             lora_path=item.lora, block_hashes=hashes,
                             remote_decode=pd)  # fmt: skip
        try:
            # (The builder's ids, see prompts.py; its lists are the request's own, but a P/D
            # decode leg is sent the same ones later.)
            core.add_request(spec, ids_in_range=True, handed_over=not pd)
        except RequestRejected as exc:
            self._rejected(rid, item, target, exc)
            return
        self.lines[rid] = (item.line, target, item.lora)
        if pd:
            self.prompts[rid] = (item, tokens, hashes)

    def _rejected(self, rid: str, item: TraceRequest, engine: int, exc: RequestRejected) -> None:
        """A request its engine refused: its row, and its user free again at once."""
        self.result.records.append(
            RequestRecord(
                id=rid,
                line=item.line,
                engine=engine,
                status=f"rejected: {exc}",
                arrival=item.arrival,
                input_tokens=item.input_length,
                output_tokens=0,
                lora=item.lora,
            )
        )
        self.finished_count += 1
        if self.free_users is not None:
            heapq.heappush(self.free_users, item.arrival)

    def _send_decode(self, rid: str, remote: RemotePrefill | None, now: float) -> None:
        """P/D: the decode leg of a prefilled request, sent when its prefill ended."""
        item, tokens, hashes = self.prompts.pop(rid)
        n = self.num_prefill
        target = n + self.pick_decode(self.cores[n:], hashes)
        self.loop.wake(target, now)
        sampling = SamplingParams(max_tokens=item.output_length, ignore_eos=True)
        # Timed from the trace's arrival: its TTFT covers prefill, pull and first decode.
        spec = EngineRequest(rid, tokens, sampling, item.arrival, lora_name=item.lora,
                             lora_path=item.lora, block_hashes=hashes,
                             remote_prefill=remote)  # fmt: skip
        # Its prefill engine took it: the decode engine does too (the same configuration).
        self.cores[target].add_request(spec, ids_in_range=True, handed_over=True)  # (last use)
        if remote is not None:
            # Its heartbeats keep the lease alive while it waits (decode engines never die
            # here): the hold lasts until its pull, however long the queue.
            self.cores[self.prefilled_on[rid]].claim_hold(remote.request_id)
        self.lines[rid] = (item.line, target, item.lora)

    def _prefilled(self, k: int, request: FinishedRequestStats) -> None:
        """P/D: a prefill leg ended; its decode leg is due now (what the prefill answered)."""
        params = self.cores[k].held_params(request.request_id)
        # None: nothing held (vLLM answers no params): the decode engine computes it all.
        remote = parse_transfer_params(params)[1] if params is not None else None
        self.prefilled_on[request.request_id] = k
        heapq.heappush(self.legs, (request.finished_time, self.num_legs,
                                   request.request_id, remote))  # fmt: skip
        self.num_legs += 1
