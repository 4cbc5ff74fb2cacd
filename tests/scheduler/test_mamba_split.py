"""Mamba-aligned prefill chunks: passes end on block boundaries where states are saved."""

from typing import Any

import pytest

from mocker.config import EngineConfig
from mocker.engine.core import EngineCore
from mocker.model_shape import MODEL_PRESETS
from mocker.request import EngineRequest, SamplingParams

QWEN3_NEXT = MODEL_PRESETS["qwen3-next-80b-a3b"]  # block 544


def _core(model: str = "qwen3-next-80b-a3b", **kw: Any) -> EngineCore:
    base: dict[str, Any] = {"model": MODEL_PRESETS[model], "num_gpu_blocks": 256,
                            "max_num_seqs": 8, "max_model_len": 16384}  # fmt: skip
    base.update(kw)
    return EngineCore(EngineConfig.of(**base))


def _computed_per_pass(core: EngineCore, num_tokens: int, rid: str = "a") -> list[int]:
    """Add one request of `num_tokens` prompt tokens; its computed tokens after each pass
    until its prompt is done."""
    core.add_request(EngineRequest(rid, list(range(num_tokens)), SamplingParams(max_tokens=2)))
    r = core.requests[rid]
    now, seen = 0.0, []
    while r.num_computed_tokens < num_tokens:
        now = core.step(now).end
        seen.append(r.num_computed_tokens)
    return seen


def test_the_preset_runs_on_544_token_blocks() -> None:
    assert _core().config.block_size == 544


def test_a_prompt_stops_at_the_last_boundary_before_its_end() -> None:
    # (1000 − 1) // 544 × 544 = 544: the state a later prompt with this prefix can hit.
    assert _computed_per_pass(_core(), 1000) == [544, 1000]


def test_a_long_prompt_stops_at_its_last_boundary() -> None:
    # (5000 − 1) // 544 = 9 blocks: 9 × 544 = 4896, then the rest.
    assert _computed_per_pass(_core(), 5000) == [4896, 5000]


def test_a_prompt_of_whole_blocks_stops_one_block_early() -> None:
    # 1088 = 2 × 544: (1088 − 1) // 544 × 544 = 544, the last token is computed after.
    assert _computed_per_pass(_core(), 1088) == [544, 1088]


def test_a_short_prompt_is_one_pass() -> None:
    assert _computed_per_pass(_core(), 500) == [500]  # no boundary inside it


def test_a_budget_short_of_the_prompt_ends_chunks_on_boundaries() -> None:
    # 1500 a pass: 1500 // 544 × 544 = 1088 each, until 4352 + 1500 passes the end: then
    # the last boundary 4896, then 5000.
    core = _core(max_num_batched_tokens=1500)
    assert _computed_per_pass(core, 5000) == [1088, 2176, 3264, 4352, 4896, 5000]


def test_a_budget_under_one_block_stops_at_the_next_boundary() -> None:
    # 512 < 544: the first chunk cannot end on a boundary, so it takes the budget; the next
    # starts mid-block and stops at the boundary 544; then the rest.
    core = _core(max_num_batched_tokens=512)
    assert _computed_per_pass(core, 1000) == [512, 544, 1000]


def test_the_split_follows_the_block_size_given() -> None:
    core = _core(block_size=1024)  # kept: larger than the aligned 544
    assert core.config.block_size == 1024
    assert _computed_per_pass(core, 3000) == [2048, 3000]  # (3000 − 1) // 1024 × 1024


@pytest.mark.parametrize("model", ["llama-3-8b", "gpt-oss-20b"])
def test_no_split_without_mamba_layers(model: str) -> None:
    assert _computed_per_pass(_core(model), 1000) == [1000]


def test_no_split_without_prefix_caching() -> None:
    # No state is saved (vLLM's mamba_cache_mode "none"): nothing to align to.
    assert _computed_per_pass(_core(enable_prefix_caching=False), 1000) == [1000]


def test_a_second_prompt_hits_the_saved_state() -> None:
    core = _core()
    _computed_per_pass(core, 1000)
    now = 0.0
    while core.has_unfinished_requests():
        now = core.step(now).end
    # The same 1000 tokens: at most (1000 − 1) // 544 = 1 block, and a state is saved there.
    assert _computed_per_pass(core, 1000, "b") == [1000]
    assert core.requests["b"].num_cached_tokens == 544


def test_two_prompts_share_the_budget_on_boundaries() -> None:
    core = _core(max_num_batched_tokens=1500)
    for rid, start in (("a", 0), ("b", 7)):
        prompt = list(range(start, start + 1000))
        core.add_request(EngineRequest(rid, prompt, SamplingParams(max_tokens=2)))
    a, b = core.requests["a"], core.requests["b"]
    now = core.step(0.0).end
    # a: [0, 544); b: min(1000, 1500 − 544 = 956) → down to the boundary 544.
    assert (a.num_computed_tokens, b.num_computed_tokens) == (544, 544)
    core.step(now)
    assert (a.num_computed_tokens, b.num_computed_tokens) == (1000, 1000)


def test_budget_split_prefill_keeps_two_states_per_mamba_group() -> None:
    # A budget of 1500 splits a 5000-token prompt at 1088, 2176, 3264, 4352 (block
    # boundaries), so each pass saves its state two blocks further on: the Mamba table is
    # sparse, and the state a pass superseded must still be released.
    config = EngineConfig.of(model=MODEL_PRESETS["qwen3-next-80b-a3b"], num_gpu_blocks=100,
                          max_model_len=8192, max_num_batched_tokens=1500)  # fmt: skip
    core = EngineCore(config)
    core.add_request(EngineRequest("a", list(range(5000)), SamplingParams(max_tokens=2)))
    request = core.requests["a"]
    now = 0.0
    while request.num_computed_tokens < 5000:
        now = core.step(now).end
        assert request.group_blocks is not None
        for g in range(3):  # the Mamba groups: the running state and at most one more
            assert sum(b is not None for b in request.group_blocks[g]) <= 2


def test_a_shared_prefix_gets_a_state_so_later_requests_hit_it() -> None:
    # vLLM 0.34 (scheduler.py's junction stop, kv_cache_coordinator.py's longest single-group
    # hit): five requests share a 3,000-token prefix, each with 1,000 tokens of its own.
    # The first computes to its last boundary, 3808 (7 × 544), saving no state inside the
    # prefix; the second finds full attention's 5 blocks (2720) cached but no Mamba state
    # there: it hits nothing, and its prefill stops at 2720 to save one; the others hit it.
    core = _core(max_num_batched_tokens=8192)
    shared = list(range(3000))
    cached, now = [], 0.0
    for i in range(5):
        own = [100_000 * (i + 1) + j for j in range(1000)]
        core.add_request(EngineRequest(f"r{i}", shared + own, SamplingParams(max_tokens=2)))
        request = core.requests[f"r{i}"]
        computed = []
        while request.num_computed_tokens < 4000:
            now = core.step(now).end
            computed.append(request.num_computed_tokens)
        cached.append(request.num_cached_tokens)
        if i == 1:
            assert computed == [2720, 3808, 4000]
        while f"r{i}" in core.requests:
            now = core.step(now).end
    assert cached == [0, 0, 2720, 2720, 2720]
