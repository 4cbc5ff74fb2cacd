"""Requests put off: adapters past max_loras, and loaded requests that cannot resume."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mocker.scheduler.state import SchedulerState

__all__ = ["batch_loras", "over_max_loras", "unblock"]


def over_max_loras(sched: SchedulerState, loras: set[str] | None, lora: str | None) -> bool:
    """Admitting a request for `lora` would put more than max_loras adapters in the batch."""
    return (
        loras is not None
        and lora is not None
        and lora not in loras
        and len(loras) >= sched._max_loras
    )


def batch_loras(sched: SchedulerState) -> set[str] | None:
    """The adapters of the running requests (None: LoRA is off)."""
    if not sched._max_loras:
        return None
    return {r.lora_name for r in sched.running if r.lora_name is not None}


def unblock(sched: SchedulerState) -> bool:
    """Requests with loaded KV hold blocks while they wait to resume. If none can resume,
    nothing runs, and no device block is on its way back, the newest gives its blocks
    back (they stay cached on the device) and waits again, so the others can go on.
    It is not admitted again before they have all resumed (`schedule_waiting`)."""
    if not sched.ready or _blocks_in_flight(sched):
        return False
    request = sched.ready.pop()
    sched.kv.free(request)
    request.num_computed_tokens = 0
    sched.waiting.push_front(request)
    return True


def _blocks_in_flight(sched: SchedulerState) -> bool:
    """Device blocks that transfers in flight will hand back, or may: displaced blocks
    being copied out (write-back), blocks pinned by their copy to the CPU tier
    (write-through), slots reserved by loads (one that times out frees them). Not
    promotions or cascades, which hold no device block: waiting for those would let a
    promotion that keeps being retried keep every loaded request from ever resuming."""
    connector = sched.connector
    if sched.kv.awaiting_displaced or sched.pulls:
        return True  # a pull that fails frees its slots
    return connector is not None and bool(
        connector.num_loading or connector.policy.has_staged or connector.stores_in_flight
    )
