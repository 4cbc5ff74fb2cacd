"""LoRA adapters' GPU slots and CPU cache: what a batch pays to bring its adapters in."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mocker.engine.lora_slots import LoraSlots
from mocker.engine.virtual import VirtualDriver
from mocker.request import EngineRequest
from tests.support.engines import make_core, req

CPU_S, DISK_S = 0.002, 0.030


def test_cold_adapters_pay_disk_then_cpu_and_warm_ones_nothing() -> None:
    slots = LoraSlots(gpu_slots=2, cpu_slots=3, cpu_load_s=CPU_S, disk_load_s=DISK_S)
    assert slots.activate(["A"]) == pytest.approx(DISK_S + CPU_S)  # disk -> CPU -> GPU
    assert slots.activate(["A"]) == 0.0  # in its slot
    assert slots.activate(["A", "B"]) == pytest.approx(DISK_S + CPU_S)
    # C takes the least recently used slot not in its batch (A), A stays in the CPU cache.
    assert slots.activate(["B", "C"]) == pytest.approx(DISK_S + CPU_S)
    assert set(slots.on_gpu) == {"B", "C"} and "A" in slots.on_cpu
    assert slots.activate(["A"]) == pytest.approx(CPU_S)  # from the CPU cache only
    slots.activate(["D"])  # a fourth adapter: the CPU cache (3) drops one not on the GPU
    assert len(slots.on_cpu) == 3 and set(slots.on_gpu) <= set(slots.on_cpu)
    assert slots.loads == {"cpu": 1, "disk": 4}


def test_preloaded_adapters_start_in_the_cpu_cache() -> None:
    slots = LoraSlots(1, 2, CPU_S, DISK_S)
    slots.preload(["A", "B"])
    assert slots.activate(["B"]) == pytest.approx(CPU_S)


def _lora(rid: str, lora: str) -> EngineRequest:
    return replace(req(rid, [ord(rid[0])] * 8, max_tokens=2), lora_name=lora)


def test_a_pass_waits_for_its_cold_adapter_visible_in_ttft() -> None:
    """Hand-computed: the same pass with a cold adapter ends disk + CPU load later (scaled by
    the speedup), and its request's first token with it; the next adapter request is warm."""
    speedup = 4.0
    base = make_core(speedup_ratio=speedup)
    base.add_request(req("n", [ord("a")] * 8, max_tokens=2))
    plain = base.step(0.0).end
    core = make_core(enable_lora=True, speedup_ratio=speedup, lora_load_ms=2.0,
                     lora_disk_load_ms=30.0)  # fmt: skip
    core.add_request(_lora("a1", "A"))
    first = core.step(0.0)
    assert first.end == pytest.approx(plain + 0.032 / speedup)
    assert first.outputs[0].latency == pytest.approx(first.end)  # its TTFT includes the load
    core.add_request(_lora("a2", "A"))
    second = core.step(first.end)
    warm = make_core(speedup_ratio=speedup)
    warm.add_request(req("n", [ord("a")] * 8, max_tokens=2))
    warm_first = warm.step(0.0)
    warm.add_request(req("m", [ord("a")] * 8, max_tokens=2))
    expected = warm.step(warm_first.end).end - warm_first.end
    assert second.end - first.end == pytest.approx(expected)  # no load: A is in its slot


@pytest.mark.parametrize("cpu_blocks", [0, 256], ids=["device-only", "with-cpu-tier"])
def test_a_batch_never_holds_more_adapters_than_max_loras(cpu_blocks: int) -> None:
    """Conservation over a mixed workload: after every pass the running requests name at
    most max_loras adapters and the GPU slots hold at most max_loras. With a CPU tier and a
    small device pool, requests also resume after tier loads (the other admission path)."""
    core = make_core(enable_lora=True, max_loras=2, max_cpu_loras=3, max_num_seqs=6,
                     num_gpu_blocks=24 if cpu_blocks else 64, num_cpu_blocks=cpu_blocks,
                     offload_policy="write-through")  # fmt: skip
    adapters = ["A", "B", "C", "D", None]
    specs = []
    for wave in range(3):  # the same prompts again, later: they hit the CPU tier
        for i in range(20):
            lora = adapters[(i * 7) % len(adapters)]
            spec = req(f"w{wave}r{i}", [i % 9 + 1] * (12 + i % 13), max_tokens=1 + i % 5)
            specs.append(replace(spec, lora_name=lora, arrival_time=wave * 5.0 + i * 0.001))
    for passes, _ in enumerate(VirtualDriver(core).steps(specs)):  # idle: jumps ahead
        running = {r.lora_name for r in core.scheduler.running if r.lora_name is not None}
        assert len(running) <= 2
        assert core.lora is not None and len(core.lora.on_gpu) <= 2
        assert passes < 5000
    assert not core.has_unfinished_requests()
    assert core.lora is not None and core.lora.loads["disk"] >= 4  # each adapter read once
    if cpu_blocks:
        assert core.connector is not None and core.connector.loaded_blocks > 0


def test_a_disk_read_never_evicts_an_adapter_of_the_same_batch() -> None:
    slots = LoraSlots(2, 3, CPU_S, DISK_S)
    slots.activate(["Y"])
    slots.activate(["P", "Q"])  # CPU cache full: Y, P, Q; GPU slots: P, Q
    # X comes from disk: the CPU victim is not Y (in this batch), so Y costs a copy only.
    assert slots.activate(["X", "Y"]) == pytest.approx(DISK_S + CPU_S + CPU_S)
