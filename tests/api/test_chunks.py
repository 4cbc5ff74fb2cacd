"""Pre-encoded chunks decode to exactly the JSON vLLM sends."""

from __future__ import annotations

import json
from typing import Any

import orjson

from mocker.api.chunks import DONE, ChunkWriter, GenerateChunkWriter, error_event, usage_dict


def _decode(chunk: bytes) -> list[Any]:
    text = chunk.decode()
    assert text.startswith("data: ") and text.endswith("\n\n")
    return [json.loads(part.removeprefix("data: ")) for part in text.split("\n\n") if part]


def test_completion_chunk_fields() -> None:
    w = ChunkWriter(chat=False, response_id="cmpl-1", created=7, model='m"x',
                    include_usage=True, continuous_usage=False)  # fmt: skip
    text = orjson.dumps(' a "quoted"\nword')[1:-1]
    (chunk,) = _decode(w.text(0, text))
    assert chunk == {
        "id": "cmpl-1", "object": "text_completion", "created": 7, "model": 'm"x',
        "choices": [{"index": 0, "text": ' a "quoted"\nword', "logprobs": None,
                     "finish_reason": None, "stop_reason": None}],
    }  # fmt: skip
    (last,) = _decode(w.text(2, b"", "stop", 42, usage=(3, 4, 0)))
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["choices"][0]["stop_reason"] == 42 and last["choices"][0]["index"] == 2
    assert "usage" not in last  # continuous usage is off


def test_chat_role_usage_and_continuous_usage() -> None:
    w = ChunkWriter(chat=True, response_id="chatcmpl-9", created=1, model="m",
                    include_usage=True, continuous_usage=True)  # fmt: skip
    (role,) = _decode(w.role(0))
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    (chunk,) = _decode(w.text(0, b" hi", usage=(5, 1, 2)))
    assert chunk["choices"][0]["delta"] == {"content": " hi"}
    assert chunk["usage"] == usage_dict(5, 1, 2)
    (usage,) = _decode(w.usage(5, 2, 3))
    assert usage["choices"] == [] and usage["usage"] == usage_dict(5, 2, 3)
    assert usage["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}


def test_error_event_and_done() -> None:
    (err,) = _decode(error_event(503, "gone"))
    assert err == {"error": {"message": "gone", "type": "ServiceUnavailableError",
                             "param": None, "code": 503}}  # fmt: skip
    assert DONE == b"data: [DONE]\n\n"


def test_token_ids_ride_on_chunks_when_asked() -> None:
    w = ChunkWriter(chat=False, response_id="cmpl-2", created=1, model="m",
                    include_usage=True, continuous_usage=True, with_ids=True)  # fmt: skip
    (first,) = _decode(w.text(0, b" a", usage=(3, 1, 0), token_ids=[9], prompt_ids=[1, 2, 3]))
    assert first["choices"][0]["prompt_token_ids"] == [1, 2, 3]
    assert first["choices"][0]["token_ids"] == [9] and first["usage"] == usage_dict(3, 1, 0)
    chat = ChunkWriter(chat=True, response_id="c", created=1, model="m", include_usage=False,
                       continuous_usage=False, with_ids=True)  # fmt: skip
    (role,) = _decode(chat.role(0, [4, 5]))
    assert role["prompt_token_ids"] == [4, 5] and role["choices"][0]["delta"]["role"]


def test_generate_chunks_are_vllms_token_stream() -> None:
    w = GenerateChunkWriter(response_id="generate-tokens-1", include_usage=True,
                            continuous_usage=False)  # fmt: skip
    (chunk,) = _decode(w.text(0, b"ignored", token_ids=[5, 6], prompt_ids=[1]))
    assert chunk == {
        "request_id": "generate-tokens-1", "usage": None, "prompt_token_ids": [1],
        "output_mode": "tokens",
        "choices": [{"index": 0, "finish_reason": None, "stop_reason": None, "token_ids": [5, 6],
                     "routed_experts": None, "sampling_mask": None, "weight_versions": None,
                     "logprobs": None}],
    }  # fmt: skip
    (usage,) = _decode(w.usage(1, 2, 0))
    assert usage["choices"] == [] and usage["usage"] == usage_dict(1, 2, 0)


def test_open_parts_frame_the_same_chunk_as_text() -> None:
    for chat in (False, True):
        w = ChunkWriter(chat=chat, response_id="r-1", created=3, model="m", include_usage=True,
                        continuous_usage=False)  # fmt: skip
        for index in (0, 2):
            head, tail = w.open_parts(index)
            assert head + b"h\\u00e9llo" + tail == w.text(index, b"h\\u00e9llo")
