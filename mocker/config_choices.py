"""EngineConfig's named choices, as vLLM names them: policies, the P/D role, LoRA ranks."""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "LORA_RANKS",
    "EvictionPolicyName",
    "KVRole",
    "OffloadPolicy",
    "PreemptionVictim",
    "SchedulingPolicy",
]

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's --max-lora-rank choices


class PreemptionVictim(StrEnum):
    """Which running request is preempted when a block cannot be allocated."""

    NEWEST = "newest"  # vLLM's default: the most recently admitted running request
    OLDEST = "oldest"


class SchedulingPolicy(StrEnum):
    """vLLM's --scheduling-policy: the order of waiting requests and the preemption victim."""

    FCFS = "fcfs"  # arrival order; a request's priority must be 0
    PRIORITY = "priority"  # (priority, arrival time), lower first; the highest is preempted


class EvictionPolicyName(StrEnum):
    """Which free cached block the device pool reuses first."""

    LRU = "lru"  # vLLM's order
    LINEAGE = "lineage"  # leaves first; never a block whose cached child remains


class OffloadPolicy(StrEnum):
    """When device KV blocks are copied to the CPU tier."""

    EVICT = "evict"  # KVBM: a cached device block is copied when it is evicted
    # vLLM's OffloadingConnector: new full prompt blocks are copied after their pass.
    WRITE_THROUGH = "write-through"


class KVRole(StrEnum):
    """P/D role, as vLLM's kv_transfer_config kv_role for NixlConnector (NONE: no P/D)."""

    NONE = "none"
    PRODUCER = "kv_producer"  # prefill: holds a finished request's KV for a pull
    CONSUMER = "kv_consumer"  # decode: pulls a prompt's KV from a prefill engine
    BOTH = "kv_both"  # either, as each request's kv_transfer_params say

    @property
    def produces(self) -> bool:
        return self in (KVRole.PRODUCER, KVRole.BOTH)

    @property
    def consumes(self) -> bool:
        return self in (KVRole.CONSUMER, KVRole.BOTH)
