"""The engine core's state: its KV stack, scheduler, timing, sampler and P/D parts."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from mocker.compiled import cpass as _cpass
from mocker.compiled import use_compiled
from mocker.config import EngineConfig
from mocker.disagg.holds import KVHolds
from mocker.disagg.pulls import PrefillPeers, RemotePulls
from mocker.engine.kv_stack import build_kv_stack
from mocker.engine.lora_slots import LoraSlots
from mocker.engine.outputs import RequestOutput
from mocker.kv.coordinator import HybridKVCacheManager
from mocker.kv.hashing import make_hasher
from mocker.kv.manager import KVCacheManager
from mocker.output_tokens import OutputTokenSampler
from mocker.request import Request, SamplingParams
from mocker.scheduler.scheduler import Scheduler
from mocker.tiers.connector import TierConnector
from mocker.tiers.link import Link
from mocker.tiers.lru import LruTier
from mocker.tiers.storage import StorageTier
from mocker.timing import TimingModel, load_timing_model

__all__ = ["CoreState", "decode_applier"]


class CoreState:
    """EngineCore's parts, which its results, pass and intake (subclasses) read and change."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        timing: TimingModel | None = None,
        output_palette: Sequence[int] | None = None,
        cpu_tier: LruTier | None = None,
        shared_tiers: Mapping[str, StorageTier] | None = None,
        engine_id: int = 0,
        peers: PrefillPeers | None = None,
    ) -> None:
        """`cpu_tier`: a CPU tier built outside (shared, or inspected by a test);
        `shared_tiers`: secondary tiers shared with other engines (mocker.engine.kv_stack);
        `peers`: how a P/D decode engine reaches prefill engines (the driver may set
        `pulls.peers` later)."""
        self.config = config
        self.timing = timing if timing is not None else load_timing_model(config.timing)
        stack = build_kv_stack(config, self.timing.prefill_ms, cpu=cpu_tier,
                               shared=shared_tiers, engine_id=engine_id)  # fmt: skip
        self.pool, self.kv = stack.pool, stack.kv
        self.cpu: LruTier | None = stack.cpu
        self.connector: TierConnector | None = stack.connector
        # The tiers record KV events (all of them, or none: TierConnector): asked every pass.
        self._tier_events = stack.connector is not None and stack.connector.cpu.record_events
        # P/D (NixlConnector): a prefill engine holds finished requests' KV for pulls; a
        # decode engine pulls prompts' KV over its link.
        scale = config.speedup_ratio
        self.holds: KVHolds | None = None
        if config.transfer.kv_role.produces:
            self.holds = KVHolds(config.transfer.hold_timeout / scale)
        self.pulls: RemotePulls | None = None
        if config.transfer.kv_role.consumes:
            link = Link(
                config.transfer.pull_gbps * 1e9 * scale,
                config.transfer.pull_latency_ms / 1000.0 / scale,
            )
            transfer = config.transfer
            self.pulls = RemotePulls(link, config.block_bytes, transfer.pull_timeout / scale,
                                     peers, transfer.kv_transfer_mode)  # fmt: skip
        # Where a pull reaches this engine (kv_transfer_params' remote_host / remote_port):
        # the driver's side channel sets it.
        self.side_channel: tuple[str, int] = ("localhost", 5600)
        self.scheduler = Scheduler(config, self.kv, self.connector, self.pulls)
        self.scheduler.count_context = self.timing.reads_context
        # A model whose decode passes keep their time over runs of passes says for how long.
        self._decode_span: Callable[[int, int], tuple[float, int]] | None = getattr(
            self.timing, "decode_span", None
        )
        # With --enable-lora: the adapters' GPU slots and CPU cache (a pass waits for its
        # batch's cold adapters to load).
        self.lora: LoraSlots | None = None
        if config.lora.enable_lora:
            scale = 1000.0 * config.speedup_ratio
            self.lora = LoraSlots(
                config.lora.max_loras, config.lora.max_cpu_loras or config.lora.max_loras,
                config.lora.lora_load_ms / scale, config.lora.lora_disk_load_ms / scale,
            )  # fmt: skip
        self.time = 0.0  # the latest time the core was driven to
        # vLLM's algorithms seed their chain with $PYTHONHASHSEED, read once here.
        self.hasher = make_hasher(
            config.cache.prefix_caching_hash_algo,
            config.seed,
            os.environ.get("PYTHONHASHSEED"),
            keep_digests=not config.cache.int_block_hashes,
        )
        self.sampler = OutputTokenSampler(
            output_palette if output_palette is not None else range(config.output.vocab_size),
            config.output.eos_token_id,
            config.output.eos_probability,
            config.seed,
        )
        self.requests: dict[str, Request] = {}
        # False: a pass builds no RequestOutput (a driver that reads only the finished
        # records and the requests' own times: replay); everything else is the same.
        self.emit_outputs = True
        # The timing model's KV tokens are a dense model's: a hybrid model's blocks hold
        # group_size of its num_layers layers each (1 for a dense model).
        layout = config.layout
        self._kv_weight = layout.group_size / layout.num_layers
        self._hybrid: HybridKVCacheManager | None = (
            self.kv if isinstance(self.kv, HybridKVCacheManager) else None
        )
        self.total_kv_tokens = config.cache.num_gpu_blocks * config.block_size
        self._applier: _cpass.DecodeApplier | None = decode_applier(
            config.block_size, self.sampler.eos_token_id
        )
        # The scheduler's compiled head asks the manager again for what it was refused.
        kv = self.kv
        if self._applier is not None and isinstance(kv, KVCacheManager) and kv.quiet_failures:
            self.scheduler.decode_head = self._applier.decodes


def decode_applier(
    block_size: int, eos_token_id: int | None, compiled: bool | None = None
) -> _cpass.DecodeApplier | None:
    """The compiled part that applies a pass's plain decode tokens (mocker/engine/_cpass.c),
    or None when `EngineCore._advance_one` applies every request (not built,
    MOCKER_COMPILED=0, or `compiled=False`)."""
    if not use_compiled("mocker.engine._cpass", compiled):
        return None
    return _cpass.DecodeApplier(Request, SamplingParams, RequestOutput, block_size, eos_token_id)
