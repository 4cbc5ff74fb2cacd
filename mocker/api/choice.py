"""One choice of a generation response: its engine request and what it has produced so far."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mocker.api.logprobs import ChoiceLogprobs
from mocker.api.stop_strings import StopMatcher
from mocker.engine.live import LiveEngine, RequestStream
from mocker.engine.outputs import RequestOutput
from mocker.request import FinishReason

__all__ = ["Choice", "cancel_all", "totals"]


@dataclass(slots=True, eq=False)
class Choice:
    """One engine request of an HTTP request (choice `index`), and its running totals."""

    index: int
    request_id: str
    engine: LiveEngine  # the data-parallel rank it runs on
    stream: RequestStream
    num_prompt_tokens: int
    # An injected `abort`: the response breaks off once this many tokens are out (or at
    # the finish, if that comes first).
    abort_at: int | None = None
    stops: StopMatcher | None = None  # stop strings, matched in the text
    stop_token_ids: frozenset[int] = frozenset()
    # return_token_ids (and the generate endpoint): the prompt, and every id generated
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    completion_tokens: int = 0
    cached_tokens: int = 0
    # P/D decode side: the prefill engine's prefix hits, reported as this request's cached
    # tokens (vLLM's remote_prefill_cached_tokens).
    remote_cached_tokens: int | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    done: bool = False
    # P/D prefill side: where a decode engine pulls the KV (from the final output).
    kv_transfer_params: dict[str, Any] | None = None
    # False for the 2nd..nth choice of a prompt (n > 1): usage counts the prompt once.
    counts_prompt: bool = True
    # logprobs asked for: this choice's, token by token
    logprobs: ChoiceLogprobs | None = None
    # echo (completions): the prompt's text to start the choice's text with, and with
    # logprobs the prompt's
    echo: str | None = None
    echo_logprobs: dict[str, Any] | None = None
    # vLLM's prompt_logprobs, when asked for (shared by the choices of a prompt)
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None

    def account(self, out: RequestOutput) -> None:
        """Token counts and finish state from one engine output (no text work)."""
        ids = out.new_token_ids
        self.completion_tokens += len(ids)
        if self.token_ids is not None:
            self.token_ids += ids
        remote = self.remote_cached_tokens
        self.cached_tokens = out.num_cached_tokens if remote is None else remote
        if out.finished:
            self.done = True
            self.kv_transfer_params = out.kv_transfer_params
            reason = out.finish_reason
            self.finish_reason = reason.value if reason is not None else None
            if reason is FinishReason.STOP and ids and ids[-1] in self.stop_token_ids:
                self.stop_reason = ids[-1]

    def text_of(self, out: RequestOutput, piece: Callable[[int], str]) -> str:
        """The new text to hand out for this output (stop strings honoured)."""
        self.account(out)
        new = "".join([piece(t) for t in out.new_token_ids])
        if self.stops is None:
            return new
        text, matched = self.stops.feed(new, final=self.done)
        if matched is not None:
            if not self.done:
                self.done = True
                self.engine.stop_request(self.request_id, self.stream)
            self.finish_reason, self.stop_reason = "stop", matched
        return text

    @property
    def abort_due(self) -> bool:
        """An injected abort is to cut the response now."""
        return self.abort_at is not None and (self.done or self.completion_tokens >= self.abort_at)

    def cancel(self) -> None:
        """Abort its engine request (a no-op once it finished)."""
        self.engine.abort(self.request_id, self.stream)


def cancel_all(choices: Sequence[Choice]) -> None:
    """End every choice now (an injected abort): their engine requests are freed, and what
    their listeners receive after this is ignored."""
    for choice in choices:
        choice.done = True
        choice.cancel()


def totals(choices: Sequence[Choice]) -> tuple[int, int, int]:
    """(prompt tokens, completion tokens, cached tokens) over the choices: the usage, each
    prompt counted once as vLLM counts it (with n > 1, its cached tokens are those of its
    first choice, the one that computes it; vLLM reports one of its choices' too)."""
    return (
        sum(c.num_prompt_tokens for c in choices if c.counts_prompt),
        sum(c.completion_tokens for c in choices),
        sum(c.cached_tokens for c in choices if c.counts_prompt),
    )
