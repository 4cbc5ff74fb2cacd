"""The non-streaming collector: every choice's text until all finish, then one JSON body."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson
from starlette.responses import Response

from mocker.api.chat_bodies import ResponsesRequest
from mocker.api.choice import Choice, cancel_all, totals
from mocker.api.chunks import usage_dict
from mocker.api.errors import error_response
from mocker.api.faults import FaultInjector
from mocker.api.lifecycle import OpenResponse
from mocker.api.logprobs import merged
from mocker.api.responses_api import response_object
from mocker.api.stream import ABORTED
from mocker.engine.outputs import RequestOutput
from mocker.engine.stream import StreamError
from mocker.request import FinishReason

__all__ = ["ResponseCollector", "ResponseHead"]


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """What a response says besides its choices."""

    response_id: str
    created: int
    model: str
    chat: bool
    headers: dict[str, str]
    generate: bool = False  # vLLM's token-in/token-out response (no text)
    return_token_ids: bool = False
    responses: ResponsesRequest | None = None  # a /v1/responses body: its response object
    message_id: str = ""  # (its one message's id)


class ResponseCollector:
    """Gathers one non-streamed response. The engine loop hands each choice's outputs to
    `on_output`; `response()` waits for the last (or the failure that ends it early)."""

    __slots__ = ("_done", "_faults", "_head", "_logprobs", "_piece", "_remaining", "_response",
                 "_texts", "cut")  # fmt: skip

    def __init__(
        self,
        response: OpenResponse,
        head: ResponseHead,
        *,
        piece: Callable[[int], str],
        faults: FaultInjector,
    ) -> None:
        self._response = response
        self._head = head
        self._piece = piece
        self._faults = faults
        self._texts: list[list[str]] = [[] for _ in response.choices]
        # logprobs asked for: each choice's, one object per output
        self._logprobs: list[list[dict[str, Any]]] = [[] for _ in response.choices]
        self._remaining = len(response.choices)
        # Set once: None when every choice finished, else the error response that ended it.
        self._done: asyncio.Future[Response | None] = asyncio.get_running_loop().create_future()
        self.cut = False  # an injected abort ended it

    def attach(self) -> None:
        for choice in self._response.choices:
            choice.stream.listen(partial(self.on_output, choice))

    def on_output(self, choice: Choice, out: RequestOutput | StreamError) -> None:
        done = self._done
        if choice.done or done.done():
            return
        if isinstance(out, StreamError):  # the engine died, or this collector failed
            done.set_result(error_response(out.status, out.client_message))
            return
        if out.finish_reason is FinishReason.ABORT and not out.new_token_ids:
            done.set_result(error_response(503, "The request was aborted."))
            return
        self._texts[choice.index].append(choice.text_of(out, self._piece))
        if choice.logprobs is not None:
            self._logprobs[choice.index].append(choice.logprobs.take(out.new_token_ids))
        if choice.abort_due:
            cancel_all(self._response.choices)  # an injected abort: the response is the error
            self.cut = True
            done.set_result(error_response(500, ABORTED))
            return
        if choice.done:
            self._remaining -= 1
            if not self._remaining:
                done.set_result(None)

    async def response(self) -> Response:
        failure = await self._done
        # Jitter: the whole response is held back by up to ttft_jitter × its latency.
        faults, response = self._faults, self._response
        share = faults.jitter(faults.config.ttft_jitter)
        latency = asyncio.get_running_loop().time() - response.arrived
        await faults.hold(share * latency, response.gone)
        if self.cut and not response.gone.is_set():
            faults.record_abort()  # it reaches the client
        if failure is not None:
            return failure
        return Response(orjson.dumps(self._body()), media_type="application/json",
                        headers=self._head.headers)  # fmt: skip

    def _body(self) -> dict[str, Any]:
        head = self._head
        choices = self._response.choices
        if head.generate:
            return self._generate_body()
        if head.responses is not None:
            [choice] = choices
            return response_object(
                head.responses, head.response_id, head.created, head.model,
                message_id=head.message_id, text="".join(self._texts[0]),
                finish_reason=choice.finish_reason, usage=totals(choices),
            )  # fmt: skip
        body: dict[str, Any] = {
            "id": head.response_id,
            "object": "chat.completion" if head.chat else "text_completion",
            "created": head.created,
            "model": head.model,
            "choices": [
                self._choice(c, (c.echo or "") + "".join(self._texts[c.index])) for c in choices
            ],
            "usage": usage_dict(*totals(choices)),
            "system_fingerprint": None,
            # P/D: top level, always present (vLLM serialises it as null when unset).
            "kv_transfer_params": choices[0].kv_transfer_params,
        }
        if head.chat and head.return_token_ids:
            body["prompt_token_ids"] = choices[0].prompt_token_ids
        if head.chat and choices[0].prompt_logprobs is not None:
            body["prompt_logprobs"] = choices[0].prompt_logprobs
        return body

    def _generate_body(self) -> dict[str, Any]:
        """vLLM's GenerateTokensResponse: token ids in, token ids out."""
        head = self._head
        choices = self._response.choices
        return {
            "request_id": head.response_id,
            "model": head.model,
            "created": head.created,
            "usage": usage_dict(*totals(choices)),
            "prompt_logprobs": None,
            "prompt_token_id_logprobs": None,
            "prompt_token_ids": choices[0].prompt_token_ids if head.return_token_ids else None,
            "mm_placeholders": None,
            "metrics": None,
            "kv_transfer_params": choices[0].kv_transfer_params,
            "ec_transfer_params": None,
            "output_mode": "tokens",
            "choices": [
                {
                    "index": c.index,
                    "finish_reason": c.finish_reason or "stop",
                    "stop_reason": c.stop_reason,
                    "token_ids": c.token_ids,
                    "routed_experts": None,
                    "sampling_mask": None,
                    "weight_versions": None,
                    "logprobs": None,
                }
                for c in choices
            ],
        }

    def _choice(self, choice: Choice, text: str) -> dict[str, Any]:
        chat = self._head.chat
        logprobs = None
        if choice.logprobs is not None:
            parts = self._logprobs[choice.index]
            if choice.echo_logprobs is not None:
                parts = [choice.echo_logprobs, *parts]
            logprobs = merged(parts, chat=chat)
        if not chat:
            out: dict[str, Any] = {
                "index": choice.index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": choice.finish_reason,
                "stop_reason": choice.stop_reason,
                "prompt_logprobs": choice.prompt_logprobs,
            }
            if self._head.return_token_ids:
                out["token_ids"] = choice.token_ids
                out["prompt_token_ids"] = choice.prompt_token_ids
            return out
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "tool_calls": [],
            "reasoning_content": None,
        }
        out = {
            "index": choice.index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
        }
        if self._head.return_token_ids:
            out["token_ids"] = choice.token_ids
        return out
