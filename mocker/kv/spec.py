"""KV cache specs and groups: vLLM's layer-type specs, grouping rule and block-size alignment."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

__all__ = [
    "KVCacheGroup",
    "KVLayout",
    "LayerShape",
    "SpecKind",
    "gated_delta_net_state_bytes",
    "kv_layout",
    "layer_kind",
    "mamba2_state_bytes",
]

# FlashAttention's kernel block sizes are MultipleOf(16): vLLM rounds the attention block
# it enlarges for a Mamba state up to a multiple of this (and of --block-size).
KERNEL_BLOCK_ALIGN = 16


class SpecKind(StrEnum):
    """vLLM's KVCacheSpecKind strings (vllm/v1/kv_cache_interface.py), the ones modelled."""

    FULL = "full_attention"
    SLIDING = "sliding_window"
    MAMBA = "mamba"


# Layer type names as models' config.json write them (HF `layer_types`, Nemotron-H's
# pattern letters are translated by the preset), mapped to the spec each layer gets.
_LAYER_KINDS = {
    "full_attention": SpecKind.FULL,
    "attention": SpecKind.FULL,
    "sliding_attention": SpecKind.SLIDING,
    "sliding_window": SpecKind.SLIDING,
    "mamba": SpecKind.MAMBA,
    "linear_attention": SpecKind.MAMBA,
}


def layer_kind(name: str) -> SpecKind:
    """The spec kind of a `layer_types` entry; a ValueError names the accepted ones."""
    try:
        return _LAYER_KINDS[name]
    except KeyError:
        raise ValueError(
            f"unknown layer type {name!r}: one of {', '.join(sorted(_LAYER_KINDS))}"
        ) from None


def mamba2_state_bytes(
    *, intermediate: int, n_groups: int, d_state: int, d_conv: int, n_heads: int,
    head_dim: int, conv_bytes: int = 2, ssm_bytes: int = 2,
) -> int:  # fmt: skip
    """One Mamba2 layer's state at TP 1 (vLLM's mamba2_state_shape): a conv state of
    (intermediate + 2·n_groups·d_state) × (d_conv − 1) and an SSM state of
    n_heads × head_dim × d_state."""
    conv_dim = intermediate + 2 * n_groups * d_state
    return conv_dim * (d_conv - 1) * conv_bytes + n_heads * head_dim * d_state * ssm_bytes


def gated_delta_net_state_bytes(
    *, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int, conv_kernel: int,
    dtype_bytes: int = 2,
) -> int:  # fmt: skip
    """One Gated DeltaNet (linear attention) layer's state at TP 1 (vLLM's
    gated_delta_net_state_shape): a conv state of (2·k_heads·k_dim + v_heads·v_dim) ×
    (kernel − 1) and a temporal state of v_heads × v_dim × k_dim."""
    conv_dim = 2 * head_k_dim * num_k_heads + head_v_dim * num_v_heads
    return (conv_dim * (conv_kernel - 1) + num_v_heads * head_v_dim * head_k_dim) * dtype_bytes


@dataclass(frozen=True, slots=True)
class KVCacheGroup:
    """Layers of one spec whose KV shares block tables: one manager each."""

    index: int
    kind: SpecKind
    layers: tuple[int, ...]  # model layer indices, strided as vLLM assigns them
    sliding_window: int | None = None

    @property
    def is_attention(self) -> bool:
        return self.kind is not SpecKind.MAMBA


@dataclass(frozen=True, slots=True)
class KVLayout:
    """How an engine's KV cache is organised: its groups, one block size for all of them,
    and the bytes of one block of the shared pool (one page per layer slot of a group)."""

    groups: tuple[KVCacheGroup, ...]
    block_size: int
    group_size: int  # layers per group (shorter groups are padded, as vLLM's)
    page_bytes: int  # one layer's page: block_size tokens of attention KV (or one Mamba state)
    mamba_page_bytes: int = 0  # the unpadded Mamba state, when there are Mamba layers
    num_layers: int = 0

    @property
    def block_bytes(self) -> int:
        return self.group_size * self.page_bytes

    @property
    def is_hybrid(self) -> bool:
        return len(self.groups) > 1 or self.groups[0].kind is not SpecKind.FULL

    @property
    def has_mamba(self) -> bool:
        return any(g.kind is SpecKind.MAMBA for g in self.groups)

    def max_blocks_per_request(
        self, num_tokens: int, max_batched_tokens: int, caching: bool = True
    ) -> int:
        """The most blocks one request of `num_tokens` holds at once, every group together
        (vLLM sums each spec's max_memory_usage the same way): full attention every block,
        a sliding window its window plus one pass's chunk and a block of slack, a Mamba
        group two states (the running one and the one it was copied from), one without
        prefix caching."""
        bs = self.block_size
        total = 0
        for group in self.groups:
            if group.kind is SpecKind.FULL:
                total += -(-num_tokens // bs)
            elif group.kind is SpecKind.SLIDING:
                assert group.sliding_window is not None
                span = min(group.sliding_window - 1 + max_batched_tokens, num_tokens)
                total += min(-(-span // bs) + 1, -(-num_tokens // bs))
            else:
                total += 2 if caching else 1
        return total

    def describe(self) -> list[dict[str, object]]:
        """The groups as /kv_event_sources and the info metric show them."""
        return [
            {
                "group_idx": g.index,
                "kv_cache_spec_kind": g.kind.value,
                "kv_cache_spec_sliding_window": g.sliding_window,
                "block_size": self.block_size,
                "num_layers": len(g.layers),
            }
            for g in self.groups
        ]


class LayerShape(Protocol):
    """What a KV layout is computed from (a ModelShape's fields: mocker.config)."""

    @property
    def num_layers(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def dtype_bytes(self) -> int: ...
    @property
    def layer_types(self) -> Sequence[str]: ...
    @property
    def sliding_window(self) -> int | None: ...
    @property
    def mamba_state_bytes(self) -> int: ...


def _layer_kinds(shape: LayerShape) -> list[SpecKind]:
    if not shape.layer_types:
        return [SpecKind.FULL] * shape.num_layers
    return [layer_kind(t) for t in shape.layer_types]


def _group_layers(kinds: Sequence[SpecKind]) -> tuple[list[tuple[SpecKind, list[int]]], int]:
    """vLLM's rule (kv_cache_planning.py, _get_kv_cache_groups_uniform_page_size): bucket
    layers by spec in order of first appearance; a group holds as many layers as the
    smallest bucket, unless the largest is under 1.5 times that (then as many as the
    largest); each bucket splits into ceil(len / size) groups, layers[i::n] in each."""
    buckets: dict[SpecKind, list[int]] = {}
    for i, kind in enumerate(kinds):
        buckets.setdefault(kind, []).append(i)
    sizes = [len(v) for v in buckets.values()]
    size = min(sizes)
    if max(sizes) < size * 1.5:
        size = max(sizes)
    groups: list[tuple[SpecKind, list[int]]] = []
    for kind, layers in buckets.items():
        n = -(-len(layers) // size)
        groups.extend((kind, layers[i::n]) for i in range(n))
    return groups, size


def kv_layout(shape: LayerShape, block_size: int) -> KVLayout:
    """The groups of a model and the block size its engine uses.

    Attention layers of every kind share one page size (the presets give every attention
    layer the same KV heads, as the real models do), so one block size serves every group.
    With Mamba layers it is vLLM's (platforms/interface.py, _align_hybrid_block_size): the
    attention block grows until its page holds a Mamba state, in multiples of the kernel
    block size (16) and of --block-size, and the Mamba page is padded up to it, so that
    every group's page is the same size and one pool serves them all.
    """
    kinds = _layer_kinds(shape)
    attn_page_per_token = 2 * shape.num_kv_heads * shape.head_dim * shape.dtype_bytes
    mamba_page = shape.mamba_state_bytes if SpecKind.MAMBA in kinds else 0
    if mamba_page:
        align = max(KERNEL_BLOCK_ALIGN, block_size)
        aligned = align * -(-mamba_page // (align * attn_page_per_token))
        block_size = max(block_size, aligned)
    grouped, size = _group_layers(kinds)
    groups = tuple(
        KVCacheGroup(
            i, kind, tuple(layers), shape.sliding_window if kind is SpecKind.SLIDING else None
        )
        for i, (kind, layers) in enumerate(grouped)
    )
    return KVLayout(
        groups=groups,
        block_size=block_size,
        group_size=size,
        page_bytes=block_size * attn_page_per_token,
        mamba_page_bytes=mamba_page,
        num_layers=len(kinds),
    )
