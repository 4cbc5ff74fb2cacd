"""vLLM's checks of a chat body (its ChatCompletionRequest validators): 400s with its messages."""

from __future__ import annotations

from typing import Any

from mocker.api.chat_bodies import ChatCompletionRequest
from mocker.api.errors import OpenAIError

__all__ = ["check_chat", "check_response_format"]

_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


def check_chat(body: ChatCompletionRequest) -> None:
    """What vLLM refuses in a chat body before it renders the prompt: an empty `tools`, a
    `tool_choice` without tools or naming none of them, a `json_schema` response format
    without its schema, and a final message both continued and followed by a generation
    prompt. (The mock renders tools into the prompt and never calls one.)"""
    tools, choice = body.tools, body.tool_choice
    if tools == []:
        raise OpenAIError(400, "`tools` must not be an empty array. Either provide at least "
                          "one tool or omit the field entirely.", "tools")  # fmt: skip
    if choice is not None and choice != "none":
        _check_tool_choice(choice, tools)
    check_response_format(body.response_format)
    if body.continue_final_message and body.add_generation_prompt:
        raise OpenAIError(400, "Cannot set both `continue_final_message` and "
                          "`add_generation_prompt` to True.")  # fmt: skip


def check_response_format(response_format: Any) -> None:
    """vLLM's check of `response_format` (a chat's, and a completion's, where the mock keeps
    it as an unknown field): a `json_schema` one must carry its schema."""
    if (
        isinstance(response_format, dict)
        and response_format.get("type") == "json_schema"
        and response_format.get("json_schema") is None
    ):
        raise OpenAIError(400, "When response_format type is 'json_schema', the 'json_schema' "
                          "field must be provided.", "response_format")  # fmt: skip


def _check_tool_choice(choice: str | dict[str, Any], tools: list[dict[str, Any]] | None) -> None:
    if tools is None:
        raise OpenAIError(400, "When using `tool_choice`, `tools` must be set.", "tool_choice")
    if not isinstance(choice, dict):
        if choice not in ("auto", "required"):
            raise OpenAIError(400, f"Invalid value for `tool_choice`: {choice}! Only named "
                              'tools, "none", "auto" or "required" are supported.',
                              "tool_choice")  # fmt: skip
        return
    function = choice.get("function")
    if not isinstance(function, dict):
        raise OpenAIError(400, f"Invalid value for `function`: `{function}` in `tool_choice`! "
                          f"{_USAGE}", "tool_choice.function")  # fmt: skip
    if "name" not in function:
        raise OpenAIError(400, f"Expected field `name` in `function` in `tool_choice`! {_USAGE}",
                          "tool_choice.function.name")  # fmt: skip
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise OpenAIError(400, f"Invalid `name` in `function`: `{name}` in `tool_choice`! "
                          f"{_USAGE}", "tool_choice.function.name")  # fmt: skip
    # (vLLM's tools are typed: each names its function. Here an untyped one names none.)
    named = (t.get("function") for t in tools if isinstance(t, dict))
    if not any(isinstance(f, dict) and f.get("name") == name for f in named):
        raise OpenAIError(400, "The tool specified in `tool_choice` does not match any of the "
                          "specified `tools`", "tool_choice")  # fmt: skip
