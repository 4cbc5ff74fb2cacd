"""A model's architecture from its Hugging Face config.json: bundled, aliased or a local file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from mocker.errors import ConfigError
from mocker.jsonfile import read_json_object

__all__ = ["MODEL_ALIASES", "ModelArch", "bundled_models", "resolve_model"]

# Ids people serve that name a bundled config by another name: the config's id and the
# checkpoint's own weight format (None: as the config says). Llama 3.3 70B has 3.1 70B's
# architecture; NVIDIA's FP8 / FP4 checkpoints are ModelOpt quantizations of Meta's.
MODEL_ALIASES: dict[str, tuple[str, str | None]] = {
    "meta-llama/Llama-3.1-8B": ("meta-llama/Meta-Llama-3.1-8B", None),
    "meta-llama/Llama-3.1-8B-Instruct": ("meta-llama/Meta-Llama-3.1-8B", None),
    "meta-llama/Meta-Llama-3.1-8B-Instruct": ("meta-llama/Meta-Llama-3.1-8B", None),
    "meta-llama/Llama-3.1-70B": ("meta-llama/Meta-Llama-3.1-70B", None),
    "meta-llama/Llama-3.1-70B-Instruct": ("meta-llama/Meta-Llama-3.1-70B", None),
    "meta-llama/Meta-Llama-3.1-70B-Instruct": ("meta-llama/Meta-Llama-3.1-70B", None),
    "meta-llama/Llama-3.3-70B-Instruct": ("meta-llama/Meta-Llama-3.1-70B", None),
    "meta-llama/Llama-3.1-405B": ("meta-llama/Meta-Llama-3.1-405B", None),
    "meta-llama/Llama-3.1-405B-Instruct": ("meta-llama/Meta-Llama-3.1-405B", None),
    "nvidia/Llama-3.1-8B-Instruct-FP8": ("meta-llama/Meta-Llama-3.1-8B", "fp8"),
    "nvidia/Llama-3.3-70B-Instruct-FP8": ("meta-llama/Meta-Llama-3.1-70B", "fp8"),
    "nvidia/Llama-3.1-405B-Instruct-FP8": ("meta-llama/Meta-Llama-3.1-405B", "fp8"),
    "nvidia/Llama-3.3-70B-Instruct-FP4": ("meta-llama/Meta-Llama-3.1-70B", "nvfp4"),
    "nvidia/Llama-3.1-8B-Instruct-FP4": ("meta-llama/Meta-Llama-3.1-8B", "nvfp4"),
}

# The checkpoint's quantization (config.json quant_method, or ModelOpt's quant_algo) as the
# weight formats mocker knows (mocker.deployment.precision).
_QUANT_METHODS = {"fp8": "fp8", "mxfp4": "mxfp4", "nvfp4": "nvfp4", "fp4": "nvfp4",
                  "awq": "int4", "gptq": "int4", "w4a16": "int4", "int4": "int4"}  # fmt: skip


# Config keys of hybrid models whose extra layers keep state mocker does not parse.
_HYBRID_KEYS = ("hybrid_override_pattern", "full_attention_interval", "linear_num_value_heads",
                "mamba_d_state", "ssm_state_size", "attn_layer_indices")  # fmt: skip


@dataclass(frozen=True, slots=True)
class ModelArch:
    """What sizes a model's weights, KV cache and passes (no weights are ever loaded)."""

    name: str  # as given (the served name's default)
    source: str  # the config file read
    aic_name: str  # the name aiconfigurator-core knows it by (a bundled id or a local path)
    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    num_experts: int = 0  # routed experts (0: a dense model)
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    first_dense_layers: int = 0  # leading layers with a dense MLP in a MoE model
    layer_types: tuple[str, ...] = ()  # per layer (empty: every layer full attention)
    sliding_window: int | None = None
    kv_lora_rank: int = 0  # MLA: the latent each token keeps (with its rope part)
    qk_rope_head_dim: int = 0
    native_quant: str | None = None  # the checkpoint's weight format (None: bf16)
    # Why its KV cache layout cannot be read from the config (Mamba or linear-attention
    # layers mocker does not parse yet); None: it can.
    layout_note: str | None = None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def num_params(self) -> int:
        """Parameters, counted from the dimensions: embeddings, attention, MLP or experts."""
        h, heads, kvh, hd = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        attention = h * heads * hd * 2 + h * kvh * hd * 2
        dense_mlp = 3 * h * self.intermediate_size
        if not self.is_moe:
            return embed + self.num_layers * (attention + dense_mlp)
        experts = 3 * h * self.moe_intermediate_size * self.num_experts + h * self.num_experts
        shared = 3 * h * self.shared_expert_intermediate_size
        moe_layers = self.num_layers - self.first_dense_layers
        return (embed + self.num_layers * attention + self.first_dense_layers * dense_mlp
                + moe_layers * (experts + shared))  # fmt: skip

    def embedding_params(self) -> int:
        """Parameters kept in 16 bits whatever the weights' format (embeddings, LM head)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def expert_params(self) -> int:
        """Parameters of the routed experts (what an MoE-only format such as MXFP4 packs)."""
        if not self.is_moe:
            return 0
        per_layer = 3 * self.hidden_size * self.moe_intermediate_size * self.num_experts
        return per_layer * (self.num_layers - self.first_dense_layers)


def _models_root() -> Path:
    return Path(str(resources.files("aiconfigurator_core") / "model_configs"))


@cache
def bundled_models() -> MappingProxyType[str, Path]:
    """The configs aiconfigurator-core ships, by model id (org/name)."""
    found = {}
    for path in sorted(_models_root().glob("*_config.json")):
        if path.name.endswith("_hf_quant_config.json"):
            continue
        org, _, name = path.name[: -len("_config.json")].partition("--")
        found[f"{org}/{name}"] = path
    return MappingProxyType(found)


def _choices() -> str:
    return ", ".join(sorted({*bundled_models(), *(a for a in MODEL_ALIASES)}, key=str.lower))


def _local_config(text: str) -> Path | None:
    """A folder's config.json (or the file itself): what vLLM and aiconfigurator read."""
    path = Path(text).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path / "config.json"
    if path.is_file() and path.name == "config.json":
        return path
    if path.is_file() or path.is_dir():
        raise ConfigError(
            f"invalid model={text!r}: give a folder holding a config.json (as vLLM reads a "
            "model), or a bundled model's id"
        )
    return None


def resolve_model(name: str) -> ModelArch:
    """The architecture `--model` names: a local folder (or file) with a config.json, or a
    bundled config by its id or an alias; a ConfigError naming --model otherwise."""
    text = name.strip()
    local = _local_config(text)
    if local is not None:
        return _checked(text, local, str(local.parent), None)
    aliases = {k.lower(): v for k, v in MODEL_ALIASES.items()}
    canonical, quant = aliases.get(text.lower(), (text, None))
    by_lower = {k.lower(): k for k in bundled_models()}
    key = by_lower.get(canonical.lower())
    if key is None:
        raise ConfigError(
            f"invalid model={name!r}: neither a folder with a config.json nor a model whose "
            f"config is bundled; bundled (and aliases): {_choices()}"
        )
    path = bundled_models()[key]
    return _checked(text, path, key, quant or _bundled_quant(path))


def _checked(name: str, path: Path, aic_name: str, quant: str | None) -> ModelArch:
    try:
        return _arch(name, path, aic_name, read_json_object(path, str(path)), quant)
    except ConfigError as exc:
        raise ConfigError(f"invalid model={name!r}: {exc}") from None


def _bundled_quant(config_path: Path) -> str | None:
    """ModelOpt's hf_quant_config.json beside a bundled config: its weight format."""
    side = config_path.with_name(config_path.name.replace("_config.json", "_hf_quant_config.json"))
    if not side.is_file():
        return None
    algo = str(json.loads(side.read_text()).get("quantization", {}).get("quant_algo", ""))
    return _QUANT_METHODS.get(algo.lower())


def _checkpoint_quant(raw: dict[str, Any]) -> str | None:
    qc = raw.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method == "modelopt":
        method = str(qc.get("quant_algo", "")).lower()
    return _QUANT_METHODS.get(method)


def _int(raw: dict[str, Any], *keys: str, default: int | None = None, least: int = 0) -> int:
    """The first of `keys` the config gives (an integer of at least `least`, else an error)."""
    for key in keys:
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= least:
            return value
        raise ConfigError(f"its config.json has {key}={value!r}: must be an integer >= {least}")
    if default is None:
        raise ConfigError(
            f"its config.json has no {keys[0]} (an integer >= {least}): mocker cannot size the "
            "model"
        )
    return default


def _arch(
    name: str, path: Path, aic_name: str, raw: dict[str, Any], quant: str | None
) -> ModelArch:
    text = raw.get("text_config")
    cfg = {**raw, **text} if isinstance(text, dict) else raw
    archs = raw.get("architectures") or ["unknown"]
    heads = _int(cfg, "num_attention_heads", least=1)
    hidden = _int(cfg, "hidden_size", least=1)
    layers = _int(cfg, "num_hidden_layers", "num_layers", least=1)
    layer_types = cfg.get("layer_types") or ()
    if not (isinstance(layer_types, list) and all(isinstance(t, str) for t in layer_types)):
        layer_types = ()
    window = cfg.get("sliding_window")
    other = sorted({t for t in layer_types if t not in ("full_attention", "sliding_attention")})
    markers = sorted(k for k in _HYBRID_KEYS if k in cfg)
    note = None
    if other or markers:
        note = f"layer types {', '.join(other)}" if other else f"keys {', '.join(markers)}"
    has_sliding = any(t == "sliding_attention" for t in layer_types)
    shared = _int(cfg, "shared_expert_intermediate_size", "shared_intermediate_size", default=0)
    n_shared = _int(cfg, "n_shared_experts", default=0)
    moe_inter = _int(cfg, "moe_intermediate_size", default=0)
    return ModelArch(
        name=name,
        source=str(path),
        aic_name=aic_name,
        architecture=str(archs[0]),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=_int(cfg, "num_key_value_heads", default=heads, least=1),
        head_dim=_int(cfg, "head_dim", default=max(1, hidden // heads), least=1),
        intermediate_size=_int(cfg, "intermediate_size", default=4 * hidden),
        vocab_size=_int(cfg, "vocab_size", least=1),
        max_position_embeddings=_int(cfg, "max_position_embeddings", default=131072),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_experts=_int(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0),
        experts_per_token=_int(cfg, "num_experts_per_tok", "experts_per_token", default=0),
        moe_intermediate_size=moe_inter or _int(cfg, "intermediate_size", default=0),
        shared_expert_intermediate_size=shared or n_shared * moe_inter,
        first_dense_layers=_int(cfg, "first_k_dense_replace", default=0),
        layer_types=tuple(layer_types),
        sliding_window=int(window) if has_sliding and isinstance(window, int) else None,
        kv_lora_rank=_int(cfg, "kv_lora_rank", default=0),
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", default=0),
        native_quant=quant or _checkpoint_quant(cfg),
        layout_note=note,
    )
