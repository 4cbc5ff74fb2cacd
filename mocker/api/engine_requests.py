"""A checked body → engine requests, admitted and handed to engines as one choice each."""

from __future__ import annotations

import logging

from mocker.api.body_fields import MAX_CHOICES
from mocker.api.choice import Choice
from mocker.api.completion_bodies import CompletionRequest
from mocker.api.errors import OpenAIError
from mocker.api.faults import FaultInjector, failure_error
from mocker.api.headers import RequestHeaders
from mocker.api.logprobs import prompt_logprobs
from mocker.api.request_checks import GenerationRequest, RequestChecks
from mocker.api.request_identity import pinned_rank, session_of
from mocker.api.stop_strings import StopMatcher
from mocker.config import EngineConfig
from mocker.disagg.params import InvalidTransferParams, parse_transfer_params
from mocker.engine.group import RankError
from mocker.engine.intake import RequestRejected, check_min_tokens, check_prompt_length
from mocker.engine.live import EngineDeadError, LiveEngine
from mocker.faults import FaultType
from mocker.request import EngineRequest, ParallelSampling, SamplingParams
from mocker.settings.lora import LoraModule

__all__ = ["EngineRequests"]

logger = logging.getLogger("mocker.requests")


def _remote_cached_tokens(spec: EngineRequest, engine: LiveEngine) -> int | None:
    """What a P/D decode request reports as cached: the prefill's hits (vLLM's
    remote_prefill_cached_tokens), at most its prompt; None when this engine does not pull
    (it ignores the params, as vLLM does without a KV consumer role)."""
    remote = spec.remote_prefill
    if remote is None or remote.cached_tokens is None or engine.core.pulls is None:
        return None
    return min(remote.cached_tokens, len(spec.prompt_token_ids))


class EngineRequests(RequestChecks):
    """A request's engine requests: checked, its fault drawn, admitted, started (all or none)."""

    # Set by OpenAIServing, which this is part of.
    config: EngineConfig
    faults: FaultInjector
    rejections: dict[str, int]

    def _sampling(
        self, body: GenerationRequest, max_tokens: int | None, num_prompt_tokens: int, param: str
    ) -> SamplingParams:
        """The request's limits, max_tokens clamped to the room the context leaves."""
        try:
            check_prompt_length(self.config, num_prompt_tokens, param)
            if max_tokens is not None:
                check_min_tokens(body.min_tokens, max_tokens)
        except RequestRejected as exc:
            raise OpenAIError(400, str(exc), exc.param) from None
        room = self.config.scheduler.max_model_len - num_prompt_tokens
        limit = room if max_tokens is None else min(max_tokens, room)
        return SamplingParams(
            max_tokens=limit,
            min_tokens=min(body.min_tokens, limit),
            ignore_eos=body.ignore_eos,
            stop_token_ids=tuple(body.stop_token_ids or ()),
        )

    def _specs(
        self,
        body: GenerationRequest,
        prompts: list[list[int]],
        max_tokens: int | None,
        request_id: str,
        param: str,
        lora: LoraModule | None = None,
        num_prompt_top: int | None = None,
        session_id: str | None = None,
    ) -> list[EngineRequest]:
        """One checked engine request per prompt (ids `<id>-<i>` when there are several);
        `num_prompt_top`: the prompt logprobs asked for (None: none)."""
        try:
            remote_decode, remote_prefill = parse_transfer_params(body.kv_transfer_params)
        except InvalidTransferParams as exc:
            raise OpenAIError(400, str(exc), "kv_transfer_params") from None
        n = body.n
        # vLLM 0.34: vllm_xargs.kv_cache_report_mode "full" announces the blocks it hits.
        report_hits = (body.vllm_xargs or {}).get("kv_cache_report_mode") == "full"
        if (remote_prefill is not None or remote_decode) and (len(prompts) > 1 or n > 1):
            # One set of kv_transfer_params answers for one engine request's KV.
            raise OpenAIError(
                400,
                "kv_transfer_params (P/D) go with one prompt and n = 1: send one prompt "
                "per request",
                "kv_transfer_params",
            )
        if len(prompts) * n > MAX_CHOICES:
            raise OpenAIError(
                400,
                f"A request makes at most {MAX_CHOICES} choices (prompts x n) in this "
                f"server; got {len(prompts)} x {n}.",
                "n",
            )
        # vLLM reads no prefix hits for a request whose prompt it scores (prompt_logprobs,
        # or an echo with logprobs).
        scored = num_prompt_top is not None or (
            isinstance(body, CompletionRequest) and body.echo and body.logprobs is not None
        )
        specs: list[EngineRequest] = []
        for i, prompt in enumerate(prompts):
            parent_id = request_id if len(prompts) == 1 else f"{request_id}-{i}"
            sampling = self._sampling(body, max_tokens, len(prompt), param)
            # n > 1: vLLM's parallel sampling, n engine requests `<j>_<id>` of one prompt.
            parent = ParallelSampling(n) if n > 1 else None
            for j in range(n):
                spec = EngineRequest(
                    parent_id if parent is None else f"{j}_{parent_id}",
                    prompt,
                    sampling,
                    priority=body.priority,
                    cache_salt=body.cache_salt,
                    session_id=session_id,
                    report_hits=report_hits,
                    lora_name=lora.name if lora is not None else None,
                    lora_path=lora.path if lora is not None else None,
                    remote_decode=remote_decode,
                    remote_prefill=remote_prefill,
                    parent=parent,
                    skip_reading_prefix_cache=scored,
                )
                try:
                    if j == 0:
                        self.engines.check_request(spec)
                    else:  # (its siblings differ in nothing else the check reads)
                        self.engines.check_request_id(spec.request_id)
                except RequestRejected as exc:
                    raise OpenAIError(400, str(exc), exc.param) from None
                specs.append(spec)
        return specs

    def _inject(self, forced: str | None, param: str) -> FaultType | None:
        """This request's injected fault: raised here, or `abort` (counted when it cuts)."""
        fault = self.faults.choose(forced)
        if fault is None or fault is FaultType.ABORT:
            return fault
        self.faults.record(fault)
        raise failure_error(fault, self.config.scheduler.max_model_len, param)

    def _engine_for(self, rank: int | None) -> LiveEngine:
        """The rank a new engine request goes to."""
        return self.engines.pick(rank)

    def _admit(self, n: int) -> None:
        """vLLM 0.34's admission control, in the API server over every rank: 503 (counted in
        vllm:admission_rejections) when `n` more requests would put more than
        --max-num-queued-reqs in flight, or while the prompts not past their first token
        hold --max-num-queued-tokens."""
        limit = self.settings.max_num_queued_reqs
        if limit is not None and self.engines.num_in_flight() + n > limit:
            self.rejections["max_num_queued_reqs"] += 1
            raise OpenAIError(503, "The engine is currently busy and cannot accept new requests. "
                              "Please try again later or on a different instance.")  # fmt: skip
        tokens = self.settings.max_num_queued_tokens
        if tokens is not None and self.engines.prefill_backlog() >= tokens:
            self.rejections["max_num_queued_tokens"] += 1
            raise OpenAIError(503, "The engine has reached its prefill token backlog limit. "
                              "Please try again later or on a different instance.")  # fmt: skip

    def _start(
        self,
        body: GenerationRequest,
        prompts: list[list[int]],
        max_tokens: int | None,
        request_id: str,
        headers: RequestHeaders,
        param: str,
        generate: bool = False,
        lora: LoraModule | None = None,
    ) -> list[Choice]:
        """Check every prompt, draw the request's fault (a client mistake is reported as such,
        never masked by one), then hand every prompt to an engine; all or nothing."""
        rank = pinned_rank(body.data_parallel_rank, headers.rank)
        try:
            self.engines.check_rank(rank)
        except RankError as exc:
            raise OpenAIError(400, str(exc), "data_parallel_rank") from None
        num_prompt_top = self._prompt_logprobs(body)
        session = session_of(body, headers.session)
        specs = self._specs(
            body, prompts, max_tokens, request_id, param, lora, num_prompt_top, session
        )
        fault = self._inject(headers.fault, param)
        self._admit(len(specs))
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        stop = tuple(s for s in stop if s)
        logprobs = self._logprobs(body)
        choices: list[Choice] = []
        try:
            for i, spec in enumerate(specs):
                engine = self._engine_for(rank)
                choice = self._choice(body, i, spec, engine, fault, stop, generate)
                if logprobs is not None:
                    choice.logprobs = logprobs.choice(spec.request_id)
                # (usage counts a prompt once, with the first of its n choices)
                choice.counts_prompt = i % body.n == 0
                choices.append(choice)
            if num_prompt_top is not None and not body.stream:  # (a stream sends none)
                tokenizer, n = self.tokenizer, body.n
                for i, prompt in enumerate(prompts):  # (once a prompt, its choices share them)
                    scored = prompt_logprobs(prompt, num_prompt_top, tokenizer.palette,
                                             tokenizer.piece)  # fmt: skip
                    for choice in choices[i * n : (i + 1) * n]:
                        choice.prompt_logprobs = scored
        except BaseException as exc:
            for choice in choices:
                choice.cancel()
            if isinstance(exc, RequestRejected):
                raise OpenAIError(400, str(exc), exc.param) from None
            if isinstance(exc, EngineDeadError):
                raise OpenAIError(503, f"The engine is not running: {exc}") from None
            raise
        return choices

    def _choice(
        self,
        body: GenerationRequest,
        index: int,
        spec: EngineRequest,
        engine: LiveEngine,
        fault: FaultType | None,
        stop: tuple[str, ...],
        generate: bool,
    ) -> Choice:
        stream = engine.add_request(spec, checked=True)  # by _specs, just before
        sampling = spec.sampling
        max_out = sampling.max_tokens or 1
        if self.settings.log_requests:
            logger.info(
                "request %s: %d prompt tokens, max_tokens %s, stream %s",
                spec.request_id, len(spec.prompt_token_ids), sampling.max_tokens,
                bool(body.stream),
            )  # fmt: skip
        ids = bool(body.return_token_ids) or generate
        return Choice(
            index,
            spec.request_id,
            engine,
            stream,
            len(spec.prompt_token_ids),
            abort_at=max(1, max_out // 2) if fault is FaultType.ABORT else None,
            stops=StopMatcher(stop, include_stop=body.include_stop_str_in_output) if stop else None,
            stop_token_ids=frozenset(sampling.stop_token_ids),
            prompt_token_ids=list(spec.prompt_token_ids) if body.return_token_ids else None,
            token_ids=[] if ids else None,
            remote_cached_tokens=_remote_cached_tokens(spec, engine),
        )
