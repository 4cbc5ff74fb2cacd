"""A request's started choices answered: one collected JSON body, or a stream of events."""

from __future__ import annotations

import time

from starlette.responses import Response

from mocker.api.body_fields import StreamOptions
from mocker.api.chat_bodies import ChatCompletionRequest, ResponsesRequest
from mocker.api.choice import Choice
from mocker.api.chunks import ChunkWriter, GenerateChunkWriter
from mocker.api.collect import ResponseCollector, ResponseHead
from mocker.api.faults import FaultInjector, JitteredEmitter
from mocker.api.ids import random_hex
from mocker.api.lifecycle import OpenResponse, OpenResponses
from mocker.api.request_checks import GenerationRequest
from mocker.api.responses import DeferredResponse, Emitter, EventStreamResponse
from mocker.api.responses_api import ResponsesStreamWriter
from mocker.api.stream import StreamRenderer
from mocker.api.text_table import FramedTable, SinkFactory
from mocker.settings import ServerSettings
from mocker.tokenizer import TextTokenizer

__all__ = ["Responder"]


def _usage_wanted(options: StreamOptions | None, forced: bool) -> tuple[bool, bool]:
    """vLLM's should_include_usage: (usage at the end, usage on every chunk). Forced
    (--enable-force-include-usage): both; else as stream_options ask, a running usage
    only with the final one."""
    if forced:
        return True, True
    if options is None:
        return False, False
    include = bool(options.include_usage)
    return include, include and bool(options.continuous_usage_stats)


class Responder:
    """Choices → the response: collected (ResponseCollector) or streamed (StreamRenderer)."""

    # Set by OpenAIServing, which this is part of.
    faults: FaultInjector
    open: OpenResponses
    settings: ServerSettings
    tokenizer: TextTokenizer
    _texts: FramedTable | None
    _sinks: SinkFactory | None

    def _respond(
        self,
        body: GenerationRequest,
        choices: list[Choice],
        model: str,
        response_id: str,
        request_id: str,
        generate: bool = False,
        responses: ResponsesRequest | None = None,
    ) -> Response:
        chat = isinstance(body, ChatCompletionRequest)
        created = int(time.time())
        response = OpenResponse(choices, self.open)
        headers = {"x-request-id": request_id}
        tokenizer, faults = self.tokenizer, self.faults
        ids = bool(body.return_token_ids)
        # (a /v1/responses message's id: drawn only for those, a syscall per request)
        message_id = f"msg_{random_hex()}" if responses is not None else ""
        if not body.stream:
            head = ResponseHead(response_id, created, model, chat, headers, generate, ids,
                                responses, message_id)  # fmt: skip
            collector = ResponseCollector(response, head, piece=tokenizer.piece, faults=faults)
            collector.attach()
            return DeferredResponse(collector.response, response.on_disconnect)
        include_usage, continuous_usage = _usage_wanted(
            body.stream_options, self.settings.force_include_usage
        )
        writer: ChunkWriter | GenerateChunkWriter | ResponsesStreamWriter
        if responses is not None:
            writer = ResponsesStreamWriter(responses, response_id, created, model, message_id)
        elif generate:
            writer = GenerateChunkWriter(
                response_id=response_id,
                include_usage=include_usage,
                continuous_usage=continuous_usage,
            )
        else:
            writer = ChunkWriter(
                chat=chat,
                response_id=response_id,
                created=created,
                model=model,
                include_usage=include_usage,
                continuous_usage=continuous_usage,
                with_ids=ids,
            )
        renderer = StreamRenderer(
            response,
            writer,
            escaped=tokenizer.escaped_piece,
            known=tokenizer.escaped_pieces,
            framed=None if self._texts is None else self._texts.framed,
            sinks=self._sinks,
            piece=tokenizer.piece,
            record_abort=faults.record_abort,
            # vLLM's clamp: a request may ask for a longer interval than the server's, not
            # a shorter one.
            stream_interval=max(self.settings.stream_interval, body.stream_interval or 1),
        )

        def start(emitter: Emitter) -> None:
            if faults.config.has_jitter:
                renderer.attach(JitteredEmitter(emitter, faults, response.arrived))
            else:
                renderer.attach(emitter)

        return EventStreamResponse(start, response.on_disconnect, headers)
