"""The request models' own checks: a prompt's union, and the encodability and range checks
of what a client sent."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from mocker.api.completion_bodies import CompletionRequest


def _errors(body: dict[str, Any]) -> list[ErrorDetails]:
    with pytest.raises(ValidationError) as caught:
        CompletionRequest.model_validate(body)
    return caught.value.errors()


@pytest.mark.parametrize("prompt", ["hi", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_each_prompt_form_is_taken_as_itself(prompt: Any) -> None:
    assert CompletionRequest.model_validate({"prompt": prompt}).prompt == prompt


def test_a_bad_id_in_a_long_prompt_costs_one_error_per_form_not_one_per_id() -> None:
    # Token ids are tried as texts and as id lists too; each of those stops at its first
    # bad item, so the error (and the work) does not grow with the prompt.
    prompt: list[Any] = list(range(10_000))
    prompt[5_000] = "x"
    errors = _errors({"prompt": prompt})
    by_form: dict[str, list[Any]] = {}
    for error in errors:
        by_form.setdefault(str(error["loc"][1]), []).append(error["loc"][2:])
    assert by_form == {
        "str": [()],
        "list[str]": [(0,)],
        "list[int]": [(5_000,)],
        "list[list[int]]": [(0,)],
    }


def test_texts_and_id_lists_still_name_their_bad_item() -> None:
    errors = _errors({"prompt": ["a", "b", 3]})
    assert ("prompt", "list[str]", 2) in [error["loc"] for error in errors]
    errors = _errors({"prompt": [[1], [2], "x"]})
    assert ("prompt", "list[list[int]]", 2) in [error["loc"] for error in errors]


@pytest.mark.parametrize(
    ("field", "value"),
    [("prompt", "\ud800"), ("model", "m\udfff"), ("user", "\ud800"), ("suffix", "\udc00")],
)
def test_a_sent_string_that_is_not_unicode_is_refused(field: str, value: str) -> None:
    body = {"prompt": "hi", field: value}
    (error,) = _errors(body)
    assert f"{field} is not valid Unicode" in error["msg"]


def test_an_unknown_field_and_a_nested_model_are_checked_too() -> None:
    (error,) = _errors({"prompt": "hi", "custom": {"k": "\ud800"}})
    assert "custom.k is not valid Unicode" in error["msg"]
    (error,) = _errors({"prompt": "hi", "custom": 2**64})
    assert "out of the 64-bit integer range" in error["msg"]


def test_an_id_prompt_beyond_64_bits_is_refused() -> None:
    (error,) = _errors({"prompt": [1, 2**64]})
    assert "prompt is out of the 64-bit integer range" in error["msg"]
