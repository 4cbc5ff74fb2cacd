"""Hybrid offload edge cases: a load into a sliding window, device hits that end inside a
chunk."""

from __future__ import annotations

from mocker.config import EngineConfig
from mocker.config_choices import OffloadPolicy
from mocker.engine.core import EngineCore
from mocker.engine.stats import FinishedRequestStats
from mocker.model_shape import ModelShape
from mocker.request import EngineRequest, SamplingParams


def shape(window: int) -> ModelShape:
    return ModelShape(num_layers=2, num_kv_heads=1, head_dim=8, sliding_window=window,
                      layer_types=("sliding_attention", "full_attention"))  # fmt: skip


class Run:
    def __init__(self, core: EngineCore) -> None:
        self.core, self.now = core, 0.0

    def drain(self, rid: str, prompt: list[int], limit: int = 500) -> FinishedRequestStats:
        core = self.core
        core.add_request(EngineRequest(rid, prompt, SamplingParams(max_tokens=1, ignore_eos=True)))
        done: list[FinishedRequestStats] = []
        for _ in range(limit):
            result = core.step(self.now)
            done += result.finished
            deadline = core.next_transfer_deadline()
            if result.idle and deadline is not None:
                self.now = max(self.now, deadline)
            else:
                self.now = max(result.end, self.now + 1e-6)
            if not core.has_unfinished_requests() and not core.has_pending_transfers():
                (stats,) = done
                return stats
        raise AssertionError(f"{rid} did not finish in {limit} steps")


def test_a_load_gives_out_of_window_positions_no_block() -> None:
    # A 200-token prompt needs 13 full-attention blocks; the window (16 tokens) 2. A pool of
    # 20 holds it computed (its window released as it goes), but not a load that gave every
    # loaded position a sliding block too (12 + 13 > 20): that request waited for ever.
    config = EngineConfig.of(model=shape(16), block_size=16, num_gpu_blocks=20, max_num_seqs=4,
                          max_num_batched_tokens=32, max_model_len=256, num_cpu_blocks=200,
                          offload_policy=OffloadPolicy.WRITE_THROUGH)  # fmt: skip
    run = Run(EngineCore(config))
    a = list(range(1000, 1200))
    run.drain("a1", a)
    run.drain("b1", list(range(5000, 5200)))  # evicts a from the device
    again = run.drain("a2", a)
    assert again.tier_hits == (("cpu", 192),)  # (200 − 1) // 16 = 12 blocks loaded
    assert run.core.pool.num_used == 0


def test_a_device_hit_inside_a_chunk_is_cut_back_when_the_tier_reaches_further() -> None:
    # Chunks of 4 blocks (64 tokens). a (300 tokens) is stored as 4 chunks; b evicts most of
    # it, leaving a device hit of 6 blocks: cut back to 4, the tier loads chunks 1..3.
    config = EngineConfig.of(model=shape(64), block_size=16, num_gpu_blocks=64, max_num_seqs=4,
                          max_num_batched_tokens=512, max_model_len=512, num_cpu_blocks=400,
                          offload_policy=OffloadPolicy.WRITE_THROUGH,
                          hybrid_chunk_size=64)  # fmt: skip
    core = EngineCore(config)
    run = Run(core)
    a = list(range(1000, 1300))
    run.drain("a1", a)
    run.drain("b1", list(range(5000, 5000 + 310)))
    probe = core.add_request(EngineRequest("probe", a, SamplingParams(max_tokens=1)))
    assert core.num_cached_prefix_blocks(probe.block_hashes[:18]) == 6
    core.abort_request("probe", run.now)
    again = run.drain("a2", a)
    assert again.num_cached_tokens == 256 and again.tier_hits == (("cpu", 192),)
    # Nothing stays pinned in the CPU tier for a request that is gone.
    assert core.connector is not None and not core.connector.cpu_pins()
