"""EngineCore: the synchronous engine. `step(now)` runs one pass; time is only ever an argument."""

from __future__ import annotations

from array import array
from collections.abc import MutableSequence, Sequence
from typing import TypeVar

from mocker.engine.core_pass import CorePass
from mocker.engine.intake import (
    RequestRejected,
    check_request,
    request_id_in_use,
    resolve_max_tokens,
)
from mocker.engine.outputs import RequestOutput
from mocker.engine.stats import FinishedRequestStats
from mocker.request import EngineRequest, Request, RequestId, RequestStatus

__all__ = ["EngineCore", "RequestRejected"]

T = TypeVar("T")


class EngineCore(CorePass):
    """Owns requests, scheduler, KV manager and timing; mutated only by whoever calls step().

    Callers outside the engine read `snapshot()` and the other read-only views; the pool,
    tiers and scheduler are the engine's own (tests of those parts reach them directly).
    """

    # -- intake -------------------------------------------------------------------------------

    def check_request(self, spec: EngineRequest, *, ids_in_range: bool = False) -> int:
        """Validate without changing anything (mocker.engine.intake); returns the resolved
        max_tokens."""
        if spec.request_id in self.requests:
            raise request_id_in_use(spec.request_id)
        return check_request(self.config, spec, ids_in_range=ids_in_range)

    def add_request(
        self,
        spec: EngineRequest,
        *,
        checked: bool = False,
        ids_in_range: bool = False,
        handed_over: bool = False,
    ) -> Request:
        """`checked`: the driver validated it already (the live engine does, at its door);
        only max_tokens is resolved again. `ids_in_range`: the driver built the prompt's ids
        (replay), so every other check runs but theirs (mocker.engine.intake).
        `handed_over`: the driver gives the request the spec's lists (the prompt's ids and
        block hashes), keeping no reference it reads again: the request grows them as its
        own instead of copying them (replay builds both afresh for each request; a copy
        of a prompt of 12k ids per request was 2% of a replay)."""
        config = self.config
        max_tokens = (
            resolve_max_tokens(config, spec)
            if checked
            else self.check_request(spec, ids_in_range=ids_in_range)
        )
        prompt = spec.prompt_token_ids
        request = Request(
            request_id=RequestId(spec.request_id),
            all_token_ids=_owned(prompt, handed_over),
            num_prompt_tokens=len(prompt),
            max_tokens=max_tokens,
            sampling=spec.sampling,
            arrival_time=spec.arrival_time,
            priority=spec.priority,
            lora_name=spec.lora_name,
            lora_path=spec.lora_path,
            session_id=spec.session_id,
            report_hits=spec.report_hits,
            token_seed=self.sampler.request_seed(spec.request_id),
            # P/D: a role this engine does not have is ignored, as vLLM's connector would.
            remote_decode=spec.remote_decode and self.holds is not None,
            remote_prefill=spec.remote_prefill if self.pulls is not None else None,
            parent=spec.parent,
            skip_reading_prefix_cache=spec.skip_reading_prefix_cache,
        )
        if self.config.cache.enable_prefix_caching:
            if spec.block_hashes is not None:
                request.block_hashes = _owned(spec.block_hashes, handed_over)
            request.enable_hashing(self.hasher, self.config.block_size, spec.cache_salt)
        self.requests[spec.request_id] = request
        self.scheduler.add(request)
        return request

    def abort_request(self, request_id: str, now: float) -> RequestOutput | None:
        """Abort wherever the request is; its blocks are freed at once. None if unknown."""
        request = self._end(request_id, now, RequestStatus.FINISHED_ABORTED)
        return None if request is None else RequestOutput.final(request, now)

    def stop_request(self, request_id: str, now: float) -> RequestOutput | None:
        """Finish with reason 'stop' (a stop string matched in the detokenized text)."""
        request = self._end(request_id, now, RequestStatus.FINISHED_STOPPED)
        return None if request is None else RequestOutput.final(request, now)

    def finish_request(
        self, request_id: str, now: float, status: RequestStatus
    ) -> FinishedRequestStats | None:
        """End a request outside a pass (abort, stop string); its record for observers."""
        request = self._end(request_id, now, status)
        return None if request is None else FinishedRequestStats.of(request)

    def _end(self, request_id: str, now: float, status: RequestStatus) -> Request | None:
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        connector, pulls = self.connector, self.pulls
        if pulls is not None and request.remote_prefill is not None:
            # Its pull stops, or never starts: either way the prefill engine frees the KV.
            if not pulls.cancel(now, request):
                pulls.peers.release(request.remote_prefill)
            request.remote_prefill = None
        elif connector is not None:
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                connector.cancel_load(now, request)
            else:
                connector.drop_request(now, request)  # a promotion or a hold it has
        self.scheduler.finish(request, status)
        request.finished_time = now
        return request


def _owned(items: Sequence[T], handed_over: bool) -> MutableSequence[T]:
    """The request's own list of these: the list (or replay's array) itself when the driver
    hands it over (see `EngineCore.add_request`), else a copy (a tuple, or one the driver
    keeps; an array stays one)."""
    if isinstance(items, array):
        return items if handed_over else array(items.typecode, items)
    return items if handed_over and type(items) is list else list(items)
