"""KV cache capacity as vLLM computes it at start-up, and the lines it logs about it."""

from __future__ import annotations

from dataclasses import dataclass

from mocker.deployment.spec import Deployment
from mocker.errors import ConfigError

__all__ = ["GIB", "KVCapacity", "kv_capacity"]

GIB = 1 << 30
# What the memory profile finds besides weights and activations (vLLM 0.34's docstring
# example in utils/mem_utils.py: NCCL ~0.5 GiB, ~1 GiB with its buffers across ranks), and
# the CUDA graphs it estimates before capturing them (its logs show 0.2-1.5 GiB).
NON_TORCH_BYTES = GIB // 2
DISTRIBUTED_NON_TORCH_BYTES = GIB
CUDA_GRAPH_BYTES = GIB // 2
# vLLM 0.34's extensible KV cache keeps this much free after warm-up (the larger of 1 GiB
# and 0.75 of the transient peak: extensible_kv_cache.py).
MARGIN_FLOOR = GIB
MARGIN_FRACTION = 0.75


@dataclass(frozen=True, slots=True)
class KVCapacity:
    """One rank's memory budget and the blocks it holds (every rank holds as many)."""

    num_gpu_blocks: int
    block_size: int
    total_bytes: int  # the GPU's memory
    weights_bytes: int  # per rank
    activation_bytes: int  # the profile run's transient peak
    other_bytes: int  # non-torch memory and CUDA graphs
    kv_bytes: int  # what the KV cache gets, per rank
    block_bytes: int  # one block's share on a rank

    @property
    def num_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def max_concurrency(self, max_model_len: int) -> float:
        return self.num_gpu_blocks / -(-max_model_len // self.block_size)

    def log_lines(self, max_model_len: int) -> list[str]:
        """What vLLM logs about the budget (its wording and number formats)."""
        concurrency = self.max_concurrency(max_model_len)
        tokens = int(concurrency * max_model_len)
        return [
            f"Model loading took {self.weights_bytes / GIB:.4f} GiB memory",
            f"Available KV cache memory: {round(self.kv_bytes / GIB, 2)} GiB",
            f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for "
            f"{max_model_len:,} tokens per request: {concurrency:.2f}x",
        ]


def weight_bytes(dep: Deployment) -> int:
    """All the weights' bytes: embeddings and LM head in 16 bits, the rest in the format's."""
    arch, fmt = dep.model, dep.weights
    total = arch.num_params()
    embed = arch.embedding_params()
    packed = arch.expert_params() if fmt.experts_only else total - embed
    return int(embed * 2 + packed * fmt.bytes_per_param + (total - embed - packed) * 2)


def activation_bytes(dep: Deployment, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """The transient peak of vLLM's profile run: a pass of max_num_batched_tokens tokens
    (hidden states, the MLP's gate and up projections on this rank) and the sampler's fp32
    logits and probabilities for up to max_num_seqs requests."""
    arch, tp = dep.model, dep.tensor_parallel_size
    inter = (arch.moe_intermediate_size * arch.experts_per_token if arch.is_moe
             else arch.intermediate_size)  # fmt: skip
    per_token = (4 * arch.hidden_size + 2 * inter // tp) * 2
    sampled = min(max_num_seqs, max_num_batched_tokens)
    return max_num_batched_tokens * per_token + sampled * arch.vocab_size * 8


def stage_layers(dep: Deployment) -> int:
    """The layers of the largest pipeline stage (vLLM sizes every rank's blocks as the
    fullest rank's, the fewest blocks of them all)."""
    return -(-dep.model.num_layers // dep.pipeline_parallel_size)


def stage_weight_bytes(dep: Deployment) -> int:
    """The weights of the heaviest pipeline stage (all of them without PP): its share of the
    layers, and the embeddings (first stage) or the LM head (last) in 16 bits."""
    total = weight_bytes(dep)
    if dep.pipeline_parallel_size == 1:
        return total
    arch = dep.model
    embed = arch.embedding_params() * 2
    per_layer = (total - embed) / arch.num_layers
    head = embed // (1 if arch.tie_word_embeddings else 2)
    return int(per_layer * stage_layers(dep) + head)


def block_share(dep: Deployment) -> float:
    """A rank's share of a block's bytes: its KV heads (at least one: heads are replicated
    when TP exceeds them; an MLA latent is whole on every rank) of its pipeline stage's
    layers."""
    arch, tp = dep.model, dep.tensor_parallel_size
    heads = 1.0 if arch.is_mla else max(1, arch.num_kv_heads // tp) / arch.num_kv_heads
    return heads * stage_layers(dep) / arch.num_layers


def kv_capacity(
    dep: Deployment,
    *,
    block_size: int,
    block_bytes: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
) -> KVCapacity:
    """The blocks vLLM would allocate: per rank, the GPU's memory (times
    --gpu-memory-utilization when given, else vLLM 0.34's extensible KV cache: all of it
    but a safety margin) less weights, non-torch memory, CUDA graphs and the activation
    peak; divided by a block's bytes on that rank. Refuses as vLLM does when nothing is
    left, or when one request of max_model_len tokens would not fit."""
    weights = stage_weight_bytes(dep) // dep.tensor_parallel_size
    act = activation_bytes(dep, max_num_batched_tokens, max_num_seqs)
    distributed = dep.num_gpus > 1
    other = (DISTRIBUTED_NON_TORCH_BYTES if distributed else NON_TORCH_BYTES) + CUDA_GRAPH_BYTES
    total = dep.gpu.memory_bytes
    util = dep.gpu_memory_utilization
    if util is None:
        margin = max(MARGIN_FLOOR, int(MARGIN_FRACTION * act))
        kv = total - weights - other - act - margin
    else:
        kv = int(total * util) - weights - other - act
    rank_block = max(1, int(block_bytes * block_share(dep)))
    blocks = max(0, kv) // rank_block
    capacity = KVCapacity(blocks, block_size, total, weights, act, other, max(kv, 0), rank_block)
    if blocks == 0:
        raise ConfigError(
            f"No available memory for the cache blocks: {dep.model.name} needs "
            f"{weights / GIB:.2f} GiB of weights per GPU on {dep.gpu.name} "
            f"({total / GIB:.1f} GiB) at TP {dep.tensor_parallel_size} and PP "
            f"{dep.pipeline_parallel_size}. {_hint(dep)}"
        )
    if blocks * block_size < max_model_len:
        need = -(-max_model_len // block_size) * rank_block
        raise ConfigError(
            f"To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({round(need / GIB, 2)} GiB KV cache is needed, which is larger than the "
            f"available KV cache memory ({round(kv / GIB, 2)} GiB). Based on the available "
            f"memory, the estimated maximum model length is {blocks * block_size}. "
            f"{_hint(dep)} Decreasing `max_model_len` also reduces what is needed."
        )
    return capacity


def _hint(dep: Deployment) -> str:
    if dep.gpu_memory_utilization is None:
        return (
            "The extensible KV cache already takes all device memory left after the model and "
            "its activations; decrease `max_model_len` or `max_num_seqs`, raise "
            "--tensor-parallel-size, or the model needs a device with more memory."
        )
    return "Try increasing `gpu_memory_utilization` or --tensor-parallel-size."
