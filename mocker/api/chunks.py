"""Pre-encoded JSON pieces for streamed chunks and responses: bytes joined, no per-token models."""

from __future__ import annotations

from typing import Any

import orjson

from mocker.api.errors import error_body

__all__ = [
    "DONE",
    "ChunkWriter",
    "GenerateChunkWriter",
    "error_event",
    "usage_dict",
    "with_kv_transfer_params",
]

DONE = b"data: [DONE]\n\n"

_FINISH = {None: b"null", "stop": b'"stop"', "length": b'"length"', "abort": b'"abort"'}


def usage_dict(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def with_kv_transfer_params(chunk: bytes, params: dict[str, Any]) -> bytes:
    """A P/D prefill's last chunk with its `kv_transfer_params` at the top level (the chunk's
    object closes just before its trailing blank line)."""
    return chunk[:-3] + b',"kv_transfer_params":' + orjson.dumps(params) + chunk[-3:]


class ChunkWriter:
    """Builds the `data: {...}\\n\\n` lines of one streamed response.

    Everything but the new text, the finish reason and the usage numbers is
    encoded once per response; a chunk is a handful of byte concatenations.
    """

    __slots__ = ("_close", "_head", "_index_heads", "_tail", "chat", "continuous_usage",
                 "include_usage", "with_ids")  # fmt: skip

    done = DONE  # what ends the stream
    preamble = b""  # what goes before its first chunk

    @staticmethod
    def error(status: int, message: str) -> bytes:
        """A mid-stream error (then the stream ends with `done`)."""
        return error_event(status, message)

    def __init__(
        self,
        *,
        chat: bool,
        response_id: str,
        created: int,
        model: str,
        include_usage: bool,
        continuous_usage: bool,
        with_ids: bool = False,
    ) -> None:
        self.chat = chat
        self.with_ids = with_ids  # return_token_ids: each chunk carries its token ids
        obj = b"chat.completion.chunk" if chat else b"text_completion"
        self._head = (
            b'data: {"id":'
            + orjson.dumps(response_id)
            + b',"object":"'
            + obj
            + b'","created":'
            + str(created).encode()
            + b',"model":'
            + orjson.dumps(model)
            + b',"choices":['
        )
        self._index_heads: dict[int, bytes] = {}
        self._close = b'"}' if chat else b'"'  # what ends the text
        self._tail = self._close + b',"logprobs":null,"finish_reason":'
        self.include_usage = include_usage
        self.continuous_usage = include_usage and continuous_usage

    def _index_head(self, index: int) -> bytes:
        head = self._index_heads.get(index)
        if head is None:
            field = b',"delta":{"content":"' if self.chat else b',"text":"'
            head = self._head + b'{"index":' + str(index).encode() + field
            self._index_heads[index] = head
        return head

    def text(
        self,
        index: int,
        escaped_text: bytes,
        finish_reason: str | None = None,
        stop_reason: str | int | None = None,
        usage: tuple[int, int, int] | None = None,
        token_ids: list[int] | None = None,
        prompt_ids: list[int] | None = None,
        logprobs: bytes | None = None,
    ) -> bytes:
        """One chunk carrying new text (already JSON-escaped) for choice `index`; with
        `token_ids`, the chunk's new ids too (and a completion's first chunk its prompt's);
        with `logprobs`, their JSON object."""
        sr = b"null" if stop_reason is None else orjson.dumps(stop_reason)
        end = b"}]}\n\n"
        if usage is not None and self.continuous_usage:
            end = b"}]," + _usage_bytes(*usage) + b"}\n\n"
        if token_ids is not None:
            ids = b',"token_ids":' + orjson.dumps(token_ids)
            if prompt_ids is not None:
                ids = b',"prompt_token_ids":' + orjson.dumps(prompt_ids) + ids
            end = ids + end
        tail = self._tail
        if logprobs is not None:
            tail = self._close + b',"logprobs":' + logprobs + b',"finish_reason":'
        return b"".join(
            (self._index_head(index), escaped_text, tail, _FINISH[finish_reason],
             b',"stop_reason":', sr, end)
        )  # fmt: skip

    def open_parts(self, index: int) -> tuple[bytes, bytes]:
        """What goes before and after the text of choice `index`'s chunks that end nothing and
        carry no usage or ids: `head + text + tail == text(index, text)`, two concatenations
        per token instead of a call that assembles seven pieces."""
        return self._index_head(index), self._tail + b'null,"stop_reason":null}]}\n\n'

    def role(self, index: int, prompt_ids: list[int] | None = None) -> bytes:
        """The first chat chunk of a choice: the assistant role and empty content (and the
        prompt's token ids, with return_token_ids)."""
        end = b"]}\n\n"
        if prompt_ids is not None:
            end = b'],"prompt_token_ids":' + orjson.dumps(prompt_ids) + b"}\n\n"
        return (
            self._head
            + b'{"index":'
            + str(index).encode()
            + b',"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}'
            + end
        )

    def usage(self, prompt: int, completion: int, cached: int) -> bytes:
        """The last chunk when include_usage: no choices, the totals."""
        return (
            self._head
            + b"],"
            + b'"usage":'
            + orjson.dumps(usage_dict(prompt, completion, cached))
            + b"}\n\n"
        )


class GenerateChunkWriter:
    """The chunks of vLLM's token-in/token-out stream (POST /inference/v1/generate): token
    ids, no text; the prompt's ids on the first chunk with return_token_ids."""

    __slots__ = ("_head", "continuous_usage", "include_usage")

    chat = False
    with_ids = True
    done = DONE
    preamble = b""
    error = ChunkWriter.error

    def __init__(self, *, response_id: str, include_usage: bool, continuous_usage: bool) -> None:
        self._head = b'data: {"request_id":' + orjson.dumps(response_id) + b',"usage":'
        self.include_usage = include_usage
        self.continuous_usage = include_usage and continuous_usage

    def text(
        self,
        index: int,
        escaped_text: bytes,
        finish_reason: str | None = None,
        stop_reason: str | int | None = None,
        usage: tuple[int, int, int] | None = None,
        token_ids: list[int] | None = None,
        prompt_ids: list[int] | None = None,
        logprobs: bytes | None = None,
    ) -> bytes:
        """One chunk of choice `index`'s new token ids (the text is not sent; nor logprobs,
        which this route refuses)."""
        parts = [self._head]
        if usage is not None and self.continuous_usage:
            parts.append(orjson.dumps(usage_dict(*usage)))
        else:
            parts.append(b"null")
        if prompt_ids is not None:
            parts += (b',"prompt_token_ids":', orjson.dumps(prompt_ids))
        sr = b"null" if stop_reason is None else orjson.dumps(stop_reason)
        parts += (
            b',"output_mode":"tokens","choices":[{"index":', str(index).encode(),
            b',"finish_reason":', _FINISH[finish_reason], b',"stop_reason":', sr,
            b',"token_ids":', orjson.dumps(token_ids or []),
            b',"routed_experts":null,"sampling_mask":null,"weight_versions":null,'
            b'"logprobs":null}]}\n\n',
        )  # fmt: skip
        return b"".join(parts)

    def usage(self, prompt: int, completion: int, cached: int) -> bytes:
        """The last chunk when include_usage: the totals, no choices."""
        return (
            self._head
            + orjson.dumps(usage_dict(prompt, completion, cached))
            + b',"output_mode":"tokens","choices":[]}\n\n'
        )


def _usage_bytes(prompt: int, completion: int, cached: int) -> bytes:
    return b"".join(
        (b'"usage":{"prompt_tokens":', str(prompt).encode(), b',"total_tokens":',
         str(prompt + completion).encode(), b',"completion_tokens":', str(completion).encode(),
         b',"prompt_tokens_details":{"cached_tokens":', str(cached).encode(), b"}}")
    )  # fmt: skip


def error_event(status: int, message: str) -> bytes:
    """A mid-stream error in the OpenAI shape (the stream then ends with [DONE])."""
    return b"data: " + orjson.dumps(error_body(status, message)) + b"\n\n"
