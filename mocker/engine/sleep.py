"""vLLM's sleep mode as engine state: scheduling paused, and which memory sleeps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["PAUSE_MODES", "SLEEP_TAGS", "SleepState"]

# What a sleep of level >= 1 puts to sleep (vLLM's executor SLEEP_TAGS), and the pause
# modes: abort what is in flight, let it finish (wait), or freeze it (keep).
SLEEP_TAGS = ("weights", "kv_cache")
PAUSE_MODES = ("abort", "wait", "keep")


@dataclass(slots=True)
class SleepState:
    """One engine's sleep: vLLM's EngineCore.sleep / wake_up, without the GPU."""

    paused: bool = False  # new requests wait; none is admitted
    frozen: bool = False  # no pass runs at all (pause mode "keep")
    level: int = 0  # the last sleep's level (0: scheduling paused only)
    tags: set[str] = field(default_factory=set)  # the memory asleep

    @property
    def sleeping(self) -> bool:
        """vLLM's is_sleeping: scheduling paused, or some memory asleep."""
        return self.paused or bool(self.tags)

    def fall_asleep(self, level: int, mode: str) -> None:
        self.paused, self.frozen, self.level = True, mode == "keep", level
        if level >= 1:
            self.tags.update(SLEEP_TAGS)

    def wake(self, tags: Sequence[str] | None) -> bool:
        """Wake the tags named (all without any; "scheduling" names the pause itself);
        scheduling resumes once no memory sleeps. Whether the engine is fully awake. As
        vLLM's executor, a tag that is not asleep changes nothing."""
        named = None if tags is None else [t for t in tags if t != "scheduling"]
        if named is None:
            self.tags.clear()
        elif all(t in self.tags for t in named):
            self.tags.difference_update(named)
        if self.tags:
            return False
        self.paused = self.frozen = False
        return True

    def gauges(self) -> tuple[tuple[str, float], ...]:
        """vllm:engine_sleep_state's series: awake, weights_offloaded (level 1), discard_all
        (level 2), as vLLM records them (set by a sleep, reset by a full wake)."""
        asleep = self.sleeping
        return (
            ("awake", 0.0 if asleep else 1.0),
            ("weights_offloaded", 1.0 if asleep and self.level == 1 else 0.0),
            ("discard_all", 1.0 if asleep and self.level == 2 else 0.0),
        )
