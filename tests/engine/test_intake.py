"""Request intake: each check's wording, its field, and the resolved max_tokens."""

from __future__ import annotations

import pytest

from mocker.config import EngineConfig
from mocker.engine.intake import (
    RequestRejected,
    check_min_tokens,
    check_prompt_length,
    check_request,
    request_id_in_use,
)
from mocker.model_shape import MODEL_PRESETS
from mocker.request import EngineRequest
from tests.support.engines import req, small_config


def test_a_valid_request_resolves_max_tokens_to_the_room_left() -> None:
    config = small_config(max_model_len=40)
    assert check_request(config, req("a", range(30), max_tokens=None)) == 10
    assert check_request(config, req("a", range(30), max_tokens=4)) == 4


def test_context_length_uses_vllms_words_and_names_the_field() -> None:
    with pytest.raises(RequestRejected) as caught:
        check_prompt_length(small_config(max_model_len=8), 8, "messages")
    assert str(caught.value) == (
        "This model's maximum context length is 8 tokens. However, your prompt contains 8 "
        "input tokens, leaving no room for the completion. Please reduce the length of the "
        "prompt."
    )
    assert caught.value.param == "messages"
    check_prompt_length(small_config(max_model_len=8), 7)


def test_min_tokens_wording() -> None:
    with pytest.raises(RequestRejected, match=r"min_tokens \(5\) must be less than or equal to "
                       r"max_tokens \(4\)\.") as caught:  # fmt: skip
        check_min_tokens(5, 4)
    assert caught.value.param == "min_tokens"
    with pytest.raises(RequestRejected, match=r"min_tokens \(-1\) must be >= 0"):
        check_min_tokens(-1, 4)
    check_min_tokens(4, 4)


def test_the_engine_and_the_api_share_one_wording() -> None:
    # The engine refuses with the same sentence the API answers a 400 with.
    config = small_config(max_model_len=16)
    with pytest.raises(RequestRejected) as engine:
        check_request(config, req("a", range(16)))
    with pytest.raises(RequestRejected) as api:
        check_prompt_length(config, 16, "prompt")
    assert str(engine.value) == str(api.value)
    with pytest.raises(RequestRejected) as engine:
        check_request(config, req("a", range(4), max_tokens=2, min_tokens=3))
    with pytest.raises(RequestRejected) as api:
        check_min_tokens(3, 2)
    assert str(engine.value) == str(api.value)


def test_request_id_in_use_wording() -> None:
    assert str(request_id_in_use("x")) == "request id 'x' is already in use"


def test_bad_strings_are_caught_before_hashing() -> None:
    with pytest.raises(RequestRejected, match="cache_salt"):
        check_request(small_config(), EngineRequest("a", [1, 2], cache_salt="\ud800"))


def test_a_hybrid_request_fits_by_every_groups_blocks() -> None:
    # qwen3-next-80b-a3b (block 544): a request of 5439 KV tokens holds ceil(5439 / 544) =
    # 10 full-attention blocks and one state per Mamba group (3) without prefix caching
    # (two with it: the running state and the one it was copied from).
    shape = MODEL_PRESETS["qwen3-next-80b-a3b"]
    uncached = EngineConfig.of(model=shape, num_gpu_blocks=13, max_model_len=5440,
                            enable_prefix_caching=False)  # fmt: skip
    assert check_request(uncached, req("a", range(5000), max_tokens=440)) == 440
    cached = EngineConfig.of(model=shape, num_gpu_blocks=15, max_model_len=5440)
    with pytest.raises(RequestRejected, match="needs up to 16 KV blocks"):
        check_request(cached, req("a", range(5000), max_tokens=440))


def test_ids_built_by_the_driver_are_counted_not_checked() -> None:
    # Replay's prompt builder makes its ids in range: only they skip the id check; every
    # other check still runs.
    config = small_config(max_model_len=40)
    bad = req("a", [2**40, -1, 3], max_tokens=4)
    with pytest.raises(RequestRejected, match="integers"):
        check_request(config, bad)
    assert check_request(config, bad, ids_in_range=True) == 4
    with pytest.raises(RequestRejected, match="empty"):
        check_request(config, req("a", [], max_tokens=4), ids_in_range=True)
    with pytest.raises(RequestRejected, match="maximum context length"):
        check_request(config, req("a", range(40), max_tokens=4), ids_in_range=True)
