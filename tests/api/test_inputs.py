"""Bodies to token ids: the served model name, prompt shapes, chat content parts."""

from __future__ import annotations

import pytest

from mocker.api.chat_bodies import ChatMessage
from mocker.api.errors import OpenAIError
from mocker.api.inputs import check_model, completion_prompts, message_dicts
from tests.support.servers import settings, tokenizer


def test_the_served_name_answers_and_the_model_path_is_accepted() -> None:
    s = settings(model="org/model", served_model_names=("a", "b"))
    assert check_model(s, None) == "a" and check_model(s, "") == "a"
    assert check_model(s, "b") == "b"
    assert check_model(s, "org/model") == "a"  # the path a client may still send
    with pytest.raises(OpenAIError) as caught:
        check_model(s, "other")
    assert caught.value.status == 404 and caught.value.param == "model"


def test_every_prompt_shape_gives_one_id_list_per_choice() -> None:
    tok = tokenizer()
    text = tok.encode("hi there")
    assert completion_prompts(tok, "hi there") == [text]
    assert completion_prompts(tok, ["hi there", "hi there"]) == [text, text]
    assert completion_prompts(tok, [5, 6, 7]) == [[5, 6, 7]]  # ids exactly as sent
    assert completion_prompts(tok, [[5], [6, 7]]) == [[5], [6, 7]]
    for bad in ("", [], [""], [tok.vocab_size]):
        with pytest.raises(OpenAIError) as caught:
            completion_prompts(tok, bad)
        assert caught.value.status == 400 and caught.value.param == "prompt"


def test_text_parts_are_joined_and_other_parts_refused() -> None:
    parts = ChatMessage.model_validate(
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
         "name": "n", "extra": 1}
    )  # fmt: skip
    assert message_dicts([parts]) == [{"role": "user", "content": "a\nb", "name": "n", "extra": 1}]
    image = ChatMessage.model_validate({"role": "user", "content": [{"type": "image_url"}]})
    with pytest.raises(OpenAIError, match=r"messages\[0\].*image_url"):
        message_dicts([image])
