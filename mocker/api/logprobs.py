"""Synthetic logprobs in vLLM's completion and chat shapes: a valid distribution per token."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from mocker.api.errors import OpenAIError
from mocker.mixing import GOLDEN, MASK64, splitmix64

__all__ = [
    "ChoiceLogprobs",
    "LogprobsFormat",
    "merged",
    "prompt_logprobs",
    "requested_logprobs",
    "requested_prompt_logprobs",
]

_LN2 = math.log(2.0)
_INT: TypeAdapter[int] = TypeAdapter(int)
_FLOOR = -9999.0  # vLLM's floor for a logprob of -inf


def requested_logprobs(
    *,
    chat: bool,
    logprobs: bool | int | None,
    top_logprobs: int | None,
    max_logprobs: int,
    vocab_size: int,
) -> int | None:
    """How many top alternatives a request asks for per token (None: no logprobs), with
    vLLM's checks and messages: a chat's `top_logprobs` needs `logprobs: true`; -1 means the
    whole vocabulary; more than --max-logprobs (-1: the vocabulary) is refused."""
    if chat:
        if top_logprobs is not None:
            if top_logprobs < -1:
                raise OpenAIError(400, "`top_logprobs` must be a positive value or -1.",
                                  "top_logprobs")  # fmt: skip
            if top_logprobs != 0 and not logprobs:
                raise OpenAIError(400, "when using `top_logprobs`, `logprobs` must be set to "
                                  "true.", "top_logprobs")  # fmt: skip
        if not logprobs:
            return None
        num = top_logprobs or 0
    else:
        if logprobs is None:
            return None
        num = int(logprobs)
        if num < -1:
            raise OpenAIError(400, "`logprobs` must be a positive value or -1.", "logprobs")
    return _within_max(num, "sample", "logprobs", max_logprobs, vocab_size)


class LogprobsFormat:
    """What a response's logprobs are made of: the top count, the token names, the shape."""

    __slots__ = ("chat", "num_top", "palette", "piece")

    def __init__(
        self, num_top: int, palette: Sequence[int], piece: Callable[[int], str], *, chat: bool
    ) -> None:
        self.num_top = num_top
        self.palette = palette
        self.piece = piece
        self.chat = chat

    def choice(self, request_id: str) -> ChoiceLogprobs:
        return ChoiceLogprobs(self, request_id)


class ChoiceLogprobs:
    """One choice's logprobs, token by token as they are handed out. Each token's are a pure
    function of (request id, position, token): the sampled token is the most likely (p in
    [0.5, 0.99)), then distinct alternatives (the tokenizer's word palette from a drawn
    place on), each half as likely as the one before, so every step is a valid distribution
    (sum below 1). As vLLM's dict, the sampled token comes first and counts among the top
    ones it ranks in."""

    __slots__ = ("_format", "_offset", "_position", "_seed")

    def __init__(self, fmt: LogprobsFormat, request_id: str) -> None:
        self._format = fmt
        self._seed = _seed(request_id)
        self._position = 0  # generated tokens handed out so far
        self._offset = 0  # completions: text characters handed out so far (text_offset)

    def _step(self, token: int) -> list[tuple[int, float]]:
        """The next generated token's (token, logprob) pairs."""
        position = self._position
        self._position += 1
        fmt = self._format
        return _distribution(self._seed, position, token, fmt.num_top, fmt.palette)

    def prompt(self, token_ids: Sequence[int]) -> dict[str, Any]:
        """An echoed prompt's logprobs (completions), vLLM's prompt_logprobs: none for its
        first token, which nothing precedes; the generated tokens' offsets follow its text.
        Their values depend on the prompt's tokens alone (`prompt_logprobs`' values)."""
        seeds = _prefix_seeds(token_ids)
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top: list[dict[str, float] | None] = []
        offsets: list[int] = []
        piece = self._format.piece
        offset = 0
        for i, token in enumerate(token_ids):
            text = piece(token)
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
            if i == 0:
                token_logprobs.append(None)
                top.append(None)
                continue
            step = _distribution(seeds[i], 0, token, self._format.num_top, self._format.palette)
            token_logprobs.append(step[0][1])
            top.append(_top(step, piece))
        self._offset = offset
        return _completion_logprobs(offsets, token_logprobs, tokens, top)

    def follow_prompt(self, logprobs: dict[str, Any] | None) -> dict[str, Any] | None:
        """Share a sibling's prompt logprobs: this choice's offsets follow the same text."""
        if logprobs is not None:
            offsets, tokens = logprobs["text_offset"], logprobs["tokens"]
            self._offset = offsets[-1] + len(tokens[-1]) if offsets else 0
        return logprobs

    def take(self, token_ids: Sequence[int]) -> dict[str, Any]:
        """The logprobs object of these next tokens (a chunk's, or a whole choice's)."""
        piece = self._format.piece
        if self._format.chat:
            k = self._format.num_top
            content = []
            for token in token_ids:
                step = self._step(token)
                content.append(
                    {
                        "token": (text := piece(token)),
                        "logprob": step[0][1],
                        "bytes": list(text.encode("utf-8", errors="replace")),
                        "top_logprobs": [
                            {"token": (alt := piece(t)), "logprob": lp,
                             "bytes": list(alt.encode("utf-8", errors="replace"))}
                            for t, lp in step[:k]
                        ],
                    }
                )  # fmt: skip
            return {"content": content}
        tokens: list[str] = []
        token_logprobs: list[float] = []
        top: list[dict[str, float]] = []
        offsets: list[int] = []
        offset = self._offset
        for token in token_ids:
            step = self._step(token)
            text = piece(token)
            tokens.append(text)
            token_logprobs.append(step[0][1])
            top.append(_top(step, piece))
            offsets.append(offset)
            offset += len(text)
        self._offset = offset
        return _completion_logprobs(offsets, token_logprobs, tokens, top)


def _distribution(
    seed: int, position: int, token: int, num_top: int, palette: Sequence[int]
) -> list[tuple[int, float]]:
    """(token, logprob) of `token`, the most likely, then its alternatives: as many as make
    `num_top` with it (at least itself), each half as likely as the one before."""
    h = splitmix64((seed + position * GOLDEN) & MASK64)
    p = 0.5 + 0.49 * (h & 0xFFFF) / 0x10000
    step = [(token, math.log(p))]
    size = len(palette)
    want = min(max(num_top, 1), size)
    rest = math.log1p(-p)
    # Consecutive palette entries from a drawn start: distinct without retries, however
    # many are asked for.
    at = (h >> 16) % size
    while len(step) < want:
        alt = palette[at]
        at = at + 1 if at + 1 < size else 0
        if alt != token:
            step.append((alt, max(rest - len(step) * _LN2, _FLOOR)))
    return step


def prompt_logprobs(
    token_ids: Sequence[int], num_top: int, palette: Sequence[int], piece: Callable[[int], str]
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs` of a prompt: none for its first token, then per token a dict
    by token id of {logprob, rank, decoded_token}, the prompt's token first. Token i's depend
    on the prompt's first i + 1 tokens alone, as a model's would (prompts that share a prefix
    share its values; an echo of the prompt shows the same)."""
    seeds = _prefix_seeds(token_ids)
    out: list[dict[str, dict[str, Any]] | None] = [None] if token_ids else []
    for i in range(1, len(token_ids)):
        step = _distribution(seeds[i], 0, token_ids[i], num_top, palette)
        entries: dict[str, dict[str, Any]] = {}
        for rank, (token, logprob) in enumerate(step, 1):
            entries.setdefault(str(token), {"logprob": logprob, "rank": rank,
                                            "decoded_token": piece(token)})  # fmt: skip
        out.append(entries)
    return out


def requested_prompt_logprobs(
    value: Any, *, stream: bool, max_logprobs: int, vocab_size: int
) -> int | None:
    """How many top alternatives per prompt token a request asks for (None: none), with
    vLLM's checks and messages."""
    if value is None:
        return None
    try:  # (as pydantic reads vLLM's `int | None`: 1.0, "1" and true are 1)
        value = _INT.validate_python(value)
    except ValidationError:
        raise OpenAIError(400, "`prompt_logprobs` must be an integer.",
                          "prompt_logprobs") from None  # fmt: skip
    if stream and (value > 0 or value == -1):
        raise OpenAIError(400, "`prompt_logprobs` are not available when `stream=True`.",
                          "prompt_logprobs")  # fmt: skip
    if value < -1:
        raise OpenAIError(400, "`prompt_logprobs` must be a positive value or -1.",
                          "prompt_logprobs")  # fmt: skip
    return _within_max(value, "prompt", "prompt_logprobs", max_logprobs, vocab_size)


def _within_max(num: int, kind: str, param: str, max_logprobs: int, vocab_size: int) -> int:
    """`num` alternatives (-1: the vocabulary), if --max-logprobs allows them (vLLM's 400)."""
    if num == -1:
        num = vocab_size
    limit = vocab_size if max_logprobs == -1 else max_logprobs
    if num > limit:
        raise OpenAIError(
            400,
            f"Requested {kind} logprobs of {num}, which is greater than max allowed: {limit}",
            param,
        )
    return num


def _completion_logprobs(
    offsets: list[int],
    token_logprobs: Sequence[float | None],
    tokens: list[str],
    top: Sequence[dict[str, float] | None],
) -> dict[str, Any]:
    """vLLM's CompletionLogProbs, its fields in order."""
    return {
        "text_offset": offsets,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": top,
    }


def _prefix_seeds(token_ids: Sequence[int]) -> list[int]:
    """Per prompt position, a seed that depends on the tokens up to it."""
    seeds, h = [], 0x243F6A8885A308D3
    for token in token_ids:
        h = splitmix64(h ^ token)
        seeds.append(h)
    return seeds


def _seed(name: str) -> int:
    digest = hashlib.blake2b(name.encode(), digest_size=8, person=b"logprobs")
    return int.from_bytes(digest.digest(), "big")


def _top(step: list[tuple[int, float]], piece: Callable[[int], str]) -> dict[str, float]:
    """A completion's top_logprobs, keyed by text as vLLM's: a later token with the same
    text does not overwrite an earlier (likelier) one."""
    top: dict[str, float] = {}
    for token, logprob in step:
        top.setdefault(piece(token), logprob)
    return top


def merged(parts: Sequence[dict[str, Any]], *, chat: bool) -> dict[str, Any]:
    """One choice's logprobs objects (one per output) as one."""
    if chat:
        return {"content": [c for part in parts for c in part["content"]]}
    keys = ("text_offset", "token_logprobs", "tokens", "top_logprobs")
    return {key: [v for part in parts for v in part[key]] for key in keys}
