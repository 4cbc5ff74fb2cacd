"""Model ids to architectures: bundled configs, aliases, local config.json folders, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mocker.deployment import bundled_models, resolve_model
from mocker.errors import ConfigError


@pytest.mark.parametrize(
    ("name", "layers", "kv_heads", "params_b", "quant"),
    [
        ("meta-llama/Llama-3.1-70B", 80, 8, 70.55, None),
        ("Qwen/Qwen3-32B", 64, 8, 32.76, None),
        ("nvidia/Llama-3.1-8B-Instruct-FP8", 32, 8, 8.03, "fp8"),
        ("openai/gpt-oss-120b", 36, 8, 116.79, "mxfp4"),
        ("Qwen/Qwen3-30B-A3B", 48, 4, 30.53, None),
    ],
)
def test_the_issues_ids_resolve_with_their_dimensions(
    name: str, layers: int, kv_heads: int, params_b: float, quant: str | None
) -> None:
    arch = resolve_model(name)
    assert (arch.name, arch.num_layers, arch.num_kv_heads) == (name, layers, kv_heads)
    # Parameters counted from the config match the published sizes (70.6B, 32.8B, 8.0B,
    # 116.8B, 30.5B) within 0.1%.
    assert arch.num_params() / 1e9 == pytest.approx(params_b, rel=1e-3)
    assert arch.native_quant == quant


def test_aliases_and_case_do_not_matter() -> None:
    a = resolve_model("META-LLAMA/llama-3.3-70b-instruct")
    assert a.aic_name == "meta-llama/Meta-Llama-3.1-70B" and a.native_quant is None
    assert resolve_model("meta-llama/Meta-Llama-3.1-70B").aic_name == a.aic_name
    assert "openai/gpt-oss-120b" in bundled_models()


def test_mixture_of_experts_and_windows_are_read() -> None:
    oss = resolve_model("openai/gpt-oss-120b")
    assert (oss.num_experts, oss.experts_per_token, oss.sliding_window) == (128, 4, 128)
    assert oss.layer_types[:2] == ("sliding_attention", "full_attention")
    ds = resolve_model("deepseek-ai/DeepSeek-V3")
    assert ds.is_mla and (ds.kv_lora_rank, ds.qk_rope_head_dim) == (512, 64)
    assert ds.native_quant == "fp8"


def test_a_local_config_folder_is_read(tmp_path: Path) -> None:
    config = {"architectures": ["MistralForCausalLM"], "hidden_size": 4096,
              "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
              "intermediate_size": 14336, "vocab_size": 32768,
              "max_position_embeddings": 32768}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    arch = resolve_model(str(tmp_path))
    assert (arch.architecture, arch.head_dim, arch.max_position_embeddings) == (
        "MistralForCausalLM", 128, 32768)  # fmt: skip
    assert arch.aic_name == str(tmp_path) and arch.layout_note is None


def test_hybrid_layouts_mocker_cannot_read_say_so() -> None:
    assert "linear_attention" in (resolve_model("Qwen/Qwen3.5-27B").layout_note or "")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("org/no-such-model", r"invalid model='org/no-such-model'.*meta-llama/Llama-3.1-70B"),
        ("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16", "has no num_hidden_layers"),
    ],
)
def test_a_model_mocker_cannot_size_is_one_clear_error(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_model(name)


def test_a_broken_local_config_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a JSON object"):
        resolve_model(str(tmp_path))


def test_only_a_config_json_is_read_and_its_dimensions_checked(tmp_path: Path) -> None:
    other = tmp_path / "llama.json"
    other.write_text("{}")
    with pytest.raises(ConfigError, match=r"give a folder holding a config\.json"):
        resolve_model(str(other))
    base = {"architectures": ["X"], "hidden_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 2, "vocab_size": 100}  # fmt: skip
    for key, value in (("num_attention_heads", 0), ("num_key_value_heads", 0),
                       ("hidden_size", "64"), ("vocab_size", -1)):  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps({**base, key: value}))
        with pytest.raises(ConfigError, match=f"has {key}=.*must be an integer >= 1"):
            resolve_model(str(tmp_path))
