"""Where each LoRA adapter's weights are: GPU slots (max_loras) and the CPU cache
(max_cpu_loras), both least recently used first, and what a batch pays to bring its
adapters into the slots (vLLM activates them inside the step, so the whole pass waits)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

__all__ = ["LoraSlots"]


class LoraSlots:
    """The adapters' residency: a batch's adapters take GPU slots (a cold one is copied from
    the CPU cache, or read from disk into it first); never a slot another batch adapter
    holds."""

    __slots__ = ("_cpu", "_cpu_s", "_disk_s", "_gpu", "cpu_capacity", "gpu_capacity", "loads")

    def __init__(
        self, gpu_slots: int, cpu_slots: int, cpu_load_s: float, disk_load_s: float
    ) -> None:
        self.gpu_capacity = gpu_slots
        self.cpu_capacity = max(cpu_slots, gpu_slots)
        self._cpu_s = cpu_load_s
        self._disk_s = disk_load_s
        self._gpu: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self._cpu: OrderedDict[str, None] = OrderedDict()
        self.loads = {"cpu": 0, "disk": 0}  # activations by where the weights came from

    def preload(self, names: Iterable[str]) -> None:
        """Adapters loaded at start-up (vLLM's --lora-modules): in the CPU cache."""
        for name in names:
            self._to_cpu(name)

    @property
    def on_gpu(self) -> tuple[str, ...]:
        return tuple(self._gpu)

    @property
    def on_cpu(self) -> tuple[str, ...]:
        return tuple(self._cpu)

    def activate(self, batch: Iterable[str]) -> float:
        """Bring the batch's adapters (at most gpu_capacity, as the scheduler ensures) into
        GPU slots; returns the seconds it takes."""
        wanted = list(dict.fromkeys(batch))
        gpu, seconds = self._gpu, 0.0
        for name in wanted:
            if name in gpu:
                gpu.move_to_end(name)
                continue
            if name in self._cpu:
                self._cpu.move_to_end(name)
                seconds += self._cpu_s
                self.loads["cpu"] += 1
            else:
                self._to_cpu(name, wanted)
                seconds += self._disk_s + self._cpu_s
                self.loads["disk"] += 1
            if len(gpu) >= self.gpu_capacity:
                victim = next((n for n in gpu if n not in wanted), None)
                if victim is not None:
                    del gpu[victim]
            gpu[name] = None
        return seconds

    def _to_cpu(self, name: str, keep: Sequence[str] = ()) -> None:
        cpu = self._cpu
        if name in cpu:
            cpu.move_to_end(name)
            return
        if len(cpu) >= self.cpu_capacity:
            # The least recently used adapter neither in a GPU slot nor in this batch goes.
            victim = next((n for n in cpu if n not in self._gpu and n not in keep), None)
            if victim is not None:
                del cpu[victim]
        cpu[name] = None
