"""KV cache specs: presets' groups, vLLM's grouping rule, Mamba block alignment, shape checks."""

from typing import Any

import pytest

from mocker.config import ConfigError, EngineConfig
from mocker.kv.spec import KVLayout, SpecKind, kv_layout
from mocker.model_shape import MODEL_PRESETS, ModelShape
from tests.support.hybrid import hybrid_shape

QWEN3_NEXT = MODEL_PRESETS["qwen3-next-80b-a3b"]
GRANITE = MODEL_PRESETS["granite-4.0-h-micro"]


def _kinds(layout: KVLayout) -> list[SpecKind]:
    return [g.kind for g in layout.groups]


def _sizes(layout: KVLayout) -> list[int]:
    return [len(g.layers) for g in layout.groups]


# -- presets ----------------------------------------------------------------------------------


def test_gpt_oss_20b_one_sliding_and_one_full_group() -> None:
    layout = kv_layout(MODEL_PRESETS["gpt-oss-20b"], 16)
    assert _kinds(layout) == [SpecKind.SLIDING, SpecKind.FULL]
    # 24 layers alternating sliding / full from layer 0: 12 each, one group each.
    assert layout.groups[0].layers == tuple(range(0, 24, 2))
    assert layout.groups[1].layers == tuple(range(1, 24, 2))
    assert [g.sliding_window for g in layout.groups] == [128, None]
    assert [g.index for g in layout.groups] == [0, 1]
    assert layout.block_size == 16 and layout.group_size == 12
    # One page per layer slot: 16 tokens × K,V × 8 heads × 64 dims × 2 bytes = 32,768;
    # 12 slots per block.
    assert layout.page_bytes == 16 * 2 * 8 * 64 * 2 == 32_768
    assert layout.block_bytes == 12 * 16 * 2 * 8 * 64 * 2 == 393_216
    assert layout.is_hybrid and not layout.has_mamba


def test_gemma_3_12b_five_strided_sliding_groups_then_one_full() -> None:
    layout = kv_layout(MODEL_PRESETS["gemma-3-12b"], 16)
    assert _kinds(layout) == [SpecKind.SLIDING] * 5 + [SpecKind.FULL]
    # 40 sliding layers, 8 full: group size min(40, 8) = 8 (40 ≥ 1.5 × 8); the sliding
    # bucket splits into ceil(40 / 8) = 5 groups, sliding[i::5] each.
    sliding = [i for i in range(48) if i % 6 != 5]
    for i in range(5):
        assert layout.groups[i].layers == tuple(sliding[i::5])
        assert layout.groups[i].sliding_window == 1024
    assert layout.groups[0].layers == (0, 6, 12, 18, 24, 30, 36, 42)
    assert layout.groups[4].layers == (4, 10, 16, 22, 28, 34, 40, 46)
    assert layout.groups[5].layers == (5, 11, 17, 23, 29, 35, 41, 47)
    assert _sizes(layout) == [8] * 6 and layout.group_size == 8
    # 16 × 2 × 8 heads × 256 dims × 2 bytes = 131,072 per page; 8 pages per block.
    assert layout.block_bytes == 8 * 131_072 == 1_048_576


def test_qwen3_next_state_bytes_block_alignment_and_groups() -> None:
    # Gated DeltaNet: conv (2·16·128 + 32·128) × (4 − 1) × 2 bytes = 8192 × 6 = 49,152;
    # temporal 32 × 128 × 128 × 2 = 1,048,576.
    assert (2 * 128 * 16 + 128 * 32) * 3 * 2 == 49_152
    assert QWEN3_NEXT.mamba_state_bytes == 49_152 + 1_048_576 == 1_097_728
    layout = kv_layout(QWEN3_NEXT, 16)
    # Attention page per token: 2 × 2 heads × 256 × 2 = 2048 bytes; the block grows to
    # 16 × ceil(1,097,728 / (16 × 2048)) = 16 × ceil(33.5) = 16 × 34 = 544 tokens.
    assert layout.block_size == 16 * -(-1_097_728 // (16 * 2048)) == 544
    assert layout.page_bytes == 544 * 2048 == 1_114_112  # the state is padded up to it
    assert layout.mamba_page_bytes == 1_097_728
    assert _kinds(layout) == [SpecKind.MAMBA] * 3 + [SpecKind.FULL]
    # 36 linear layers, 12 full: group size 12, linear[i::3] in each Mamba group.
    assert layout.groups[0].layers == tuple(range(0, 48, 4))
    assert layout.groups[1].layers == tuple(range(1, 48, 4))
    assert layout.groups[2].layers == tuple(range(2, 48, 4))
    assert layout.groups[3].layers == tuple(range(3, 48, 4))
    assert layout.block_bytes == 12 * 1_114_112
    assert layout.has_mamba and layout.is_hybrid


def test_granite_4_h_micro_state_bytes_block_and_ten_groups() -> None:
    # Mamba2: conv (4096 + 2·1·128) × 3 × 2 = 26,112; SSM 64 × 64 × 128 × 2 = 1,048,576.
    assert GRANITE.mamba_state_bytes == 26_112 + 1_048_576 == 1_074_688
    layout = kv_layout(GRANITE, 16)
    # 2 × 8 × 64 × 2 = 2048 bytes a token: 16 × ceil(1,074,688 / 32,768 = 32.8) = 16 × 33.
    assert layout.block_size == 528
    assert _kinds(layout) == [SpecKind.MAMBA] * 9 + [SpecKind.FULL]
    # 36 Mamba layers and 4 attention ones (5, 15, 25, 35): 9 Mamba groups of 4.
    assert _sizes(layout) == [4] * 10
    mamba = [i for i in range(40) if i % 10 != 5]
    assert layout.groups[0].layers == (0, 10, 20, 30)
    assert layout.groups[5].layers == tuple(mamba[5::9]) == (6, 16, 26, 36)
    assert layout.groups[9].layers == (5, 15, 25, 35)


# Dense presets: layers × 2 × kv_heads × head_dim × 2 bytes a token, × 16 a block.
DENSE = {
    "llama-3-8b": (32, 32 * 2 * 8 * 128 * 2),  # 131,072
    "llama-3-70b": (80, 80 * 2 * 8 * 128 * 2),  # 327,680
    "qwen2.5-7b": (28, 28 * 2 * 4 * 128 * 2),  # 57,344
    "mistral-7b": (32, 32 * 2 * 8 * 128 * 2),
}


@pytest.mark.parametrize(("name", "expected"), DENSE.items())
def test_dense_presets_one_full_group_bytes_unchanged(name: str, expected: tuple[int, int]) -> None:
    num_layers, per_token = expected
    shape = MODEL_PRESETS[name]
    layout = kv_layout(shape, 16)
    assert _kinds(layout) == [SpecKind.FULL]
    assert layout.groups[0].layers == tuple(range(num_layers))
    assert shape.kv_bytes_per_token == per_token
    assert layout.block_bytes == 16 * per_token
    assert EngineConfig(model=shape).block_bytes == 16 * per_token
    assert not layout.is_hybrid


def test_every_preset_without_layer_types_is_dense() -> None:
    for name, shape in MODEL_PRESETS.items():
        layout = kv_layout(shape, 16)
        if shape.layer_types:
            assert layout.is_hybrid, name
        else:
            assert len(layout.groups) == 1 and layout.block_bytes == 16 * shape.kv_bytes_per_token


# -- the grouping rule ----------------------------------------------------------------------


def test_sizes_under_one_and_a_half_times_take_the_largest() -> None:
    # 12 sliding + 13 full: 13 < 1.5 × 12 = 18, so a group holds 13 layers; the sliding
    # group (12 layers) is padded to 13 slots.
    layout = kv_layout(hybrid_shape(["sliding_attention"] * 12 + ["full_attention"] * 13,
                                    window=32), 16)  # fmt: skip
    assert _kinds(layout) == [SpecKind.SLIDING, SpecKind.FULL]
    assert _sizes(layout) == [12, 13] and layout.group_size == 13
    # 16 tokens × 2 × 1 head × 4 dims × 2 bytes = 256 per page; 13 pages.
    assert layout.block_bytes == 13 * 256


def test_sizes_at_one_and_a_half_times_split_the_largest() -> None:
    # 12 sliding + 18 full: 18 is not < 18: size 12, the full bucket splits into
    # ceil(18 / 12) = 2 groups of full[i::2] (9 layers each).
    layout = kv_layout(hybrid_shape(["sliding_attention"] * 12 + ["full_attention"] * 18,
                                    window=32), 16)  # fmt: skip
    assert _kinds(layout) == [SpecKind.SLIDING, SpecKind.FULL, SpecKind.FULL]
    assert layout.groups[1].layers == tuple(range(12, 30, 2))
    assert layout.groups[2].layers == tuple(range(13, 30, 2))
    assert layout.group_size == 12 and layout.block_bytes == 12 * 256


def test_groups_follow_the_first_appearance_of_each_kind() -> None:
    layout = kv_layout(hybrid_shape(["full_attention", "sliding_attention"] * 2, window=8), 4)
    assert _kinds(layout) == [SpecKind.FULL, SpecKind.SLIDING]
    assert [g.layers for g in layout.groups] == [(0, 2), (1, 3)]


# -- block sizes ------------------------------------------------------------------------------


def test_a_larger_block_size_than_the_aligned_one_is_kept() -> None:
    # align = 1024: 1024 × ceil(1,097,728 / (1024 × 2048)) = 1024 × 1.
    assert kv_layout(QWEN3_NEXT, 1024).block_size == 1024
    assert EngineConfig.of(model=QWEN3_NEXT, block_size=1024).block_size == 1024
    # 32: 32 × ceil(1,097,728 / 65,536 = 16.75) = 32 × 17 = 544.
    assert EngineConfig.of(model=QWEN3_NEXT, block_size=32).block_size == 544


def test_engine_config_takes_the_aligned_block_size() -> None:
    config = EngineConfig(model=QWEN3_NEXT)
    assert config.block_size == 544 and config.layout.block_size == 544
    again = config.with_changes(max_num_seqs=8)
    assert again.block_size == 544 and again.layout == config.layout
    assert config.block_bytes == 12 * 544 * 2048
    assert EngineConfig(model=GRANITE).block_size == 528


def test_a_dense_model_refuses_a_block_size_not_a_power_of_two() -> None:
    with pytest.raises(ConfigError, match="block_size=48"):
        EngineConfig.of(block_size=48)
    with pytest.raises(ConfigError, match="block_size=2048"):
        EngineConfig.of(block_size=2048)


def test_a_mamba_hybrid_refuses_a_given_block_size_not_a_power_of_two() -> None:
    with pytest.raises(ConfigError, match="block_size=600"):
        EngineConfig.of(model=QWEN3_NEXT, block_size=600)
    assert EngineConfig.of(model=QWEN3_NEXT, block_size=544).block_size == 544  # aligned: stands


def test_with_changes_starts_from_the_given_block_size() -> None:
    qwen = EngineConfig(model=QWEN3_NEXT)
    assert qwen.block_size == 544 and qwen.cache.block_size == 16
    assert qwen.with_changes(model=MODEL_PRESETS["granite-4.0-h-micro"]).block_size == 528
    assert qwen.with_changes(model=MODEL_PRESETS["llama-3-8b"]).block_size == 16


# -- max blocks per request --------------------------------------------------------------------


def test_max_blocks_per_request_gpt_oss() -> None:
    layout = kv_layout(MODEL_PRESETS["gpt-oss-20b"], 16)
    # 1000 tokens, 256 a pass: full ceil(1000 / 16) = 63; sliding
    # min(ceil(min(127 + 256, 1000) / 16) + 1, 63) = ceil(383 / 16) + 1 = 24 + 1 = 25.
    assert layout.max_blocks_per_request(1000, 256) == 63 + 25
    # 100 tokens: full 7; sliding min(ceil(100 / 16) + 1, 7) = 7.
    assert layout.max_blocks_per_request(100, 256) == 7 + 7


def test_max_blocks_per_request_qwen3_next() -> None:
    layout = kv_layout(QWEN3_NEXT, 16)
    # Full ceil(1000 / 544) = 2, three Mamba groups two states each.
    assert layout.max_blocks_per_request(1000, 8192) == 2 + 3 * 2
    # ceil(5000 / 544) = 10 (9 × 544 = 4896).
    assert layout.max_blocks_per_request(5000, 8192) == 10 + 3 * 2


# -- shape validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"layer_types": ("full_attention",)}, "one type per layer"),
        ({"layer_types": ("full_attention", "bogus")}, "unknown layer type 'bogus'"),
        ({"layer_types": ("full_attention", "sliding_attention")}, "sliding_window"),
        ({"layer_types": ("full_attention", "mamba")}, "mamba_state_bytes"),
        ({"layer_types": ("full_attention",) * 2, "sliding_window": 8}, "without a sliding"),
        ({"layer_types": ("full_attention",) * 2, "mamba_state_bytes": 8}, "without a mamba"),
    ],
)
def test_model_shape_refuses_inconsistent_layer_types(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ModelShape(num_layers=2, **kw)


def test_model_shape_refuses_a_window_without_layer_types() -> None:
    with pytest.raises(ConfigError, match="sliding_window"):
        ModelShape(num_layers=2, sliding_window=8)
    with pytest.raises(ConfigError, match="mamba_state_bytes"):
        ModelShape(num_layers=2, mamba_state_bytes=8)


def test_from_mapping_computes_the_state_bytes() -> None:
    gdn = ModelShape.from_mapping(
        {
            "num_layers": 4,
            "num_kv_heads": 2,
            "head_dim": 256,
            "layer_types": ["linear_attention"] * 3 + ["full_attention"],
            "gated_delta_net": {"num_k_heads": 16, "num_v_heads": 32, "head_k_dim": 128,
                                "head_v_dim": 128, "conv_kernel": 4},
        }
    )  # fmt: skip
    assert gdn.mamba_state_bytes == 1_097_728
    assert gdn.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    m2 = ModelShape.from_mapping(
        {
            "num_layers": 2,
            "layer_types": ["mamba", "attention"],
            "mamba2": {"intermediate": 4096, "n_groups": 1, "d_state": 128, "d_conv": 4,
                       "n_heads": 64, "head_dim": 64},
        }
    )  # fmt: skip
    assert m2.mamba_state_bytes == 1_074_688


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"num_layers": 2, "bogus": 1}, "unknown model shape key"),
        (
            {
                "num_layers": 2,
                "layer_types": ["mamba", "attention"],
                "mamba2": {"intermediate": 4096},
            },
            "mamba2",
        ),
        (
            {
                "num_layers": 2,
                "layer_types": ["mamba", "attention"],
                "mamba_state_bytes": 5,
                "mamba2": {},
            },
            "instead of mamba_state_bytes",
        ),
        ({"num_layers": 2, "layer_types": "mamba"}, "list of strings"),
    ],
)
def test_from_mapping_refuses_bad_input(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ModelShape.from_mapping(raw)
