"""LMCache's synchronous loads: a tier hit is copied inside the pass that admits the request,
and every request in that pass waits for it."""

from __future__ import annotations

from typing import Any

import pytest

from mocker.engine.core import EngineCore
from mocker.engine.virtual import VirtualDriver, VirtualRun
from mocker.request import RequestStatus
from tests.support.engines import prefill_ms
from tests.tiers.test_connector import BLOCK_S, host_config, one, prompt


def _run(sync: bool, with_decoder: bool) -> tuple[EngineCore, VirtualRun, list[Any], list[float]]:
    # a (8 blocks) is pushed out of the device by b and c, then comes back at 5.2 and finds
    # 7 blocks in the CPU tier; a decoder runs from 5.0 on, alone until then.
    core = EngineCore(host_config(offload_policy="write-through", sync_loads=sync))
    reqs = [one("a", prompt(0), 0.0), one("b", prompt(1), 1.0), one("c", prompt(2), 2.0),
            one("a2", prompt(0), 5.2)]  # fmt: skip
    if with_decoder:
        reqs.append(one("d", prompt(5, 4), 5.0, max_tokens=40))
    seen: list[Any] = []
    decoded: list[float] = []  # when the decoder's tokens exist
    result = VirtualRun()
    for step in VirtualDriver(core).steps(reqs, run=result):
        if "a2" in core.requests:
            seen.append(core.requests["a2"].status)
        decoded += [o.time for o in step.outputs if o.request_id == "d" and o.new_token_ids]
    return core, result, seen, decoded


def test_the_pass_that_admits_it_reads_its_hit_first() -> None:
    core, result, seen, _ = _run(sync=True, with_decoder=False)
    a2 = {r.request_id: r for r in result.finished}["a2"]
    assert RequestStatus.WAITING_FOR_REMOTE_KVS not in seen  # never parked
    assert a2.num_tier_cached_tokens == 28 and a2.num_cached_tokens == 28
    # One pass: the 7 blocks' copy, then the prefill of the 4 tokens left.
    ttft = 7 * BLOCK_S + prefill_ms(4) / 1000
    assert a2.first_token_time is not None
    assert a2.first_token_time - a2.arrival_time == pytest.approx(ttft)
    assert core.connector is not None and core.connector.loaded_blocks == 7
    assert core.cpu is not None and core.cpu.num_pinned() == 0  # read, then unpinned


def test_a_request_decoding_beside_it_waits_for_the_copy() -> None:
    # The decoder's token from the pass that computes a2's first token: synchronous, that
    # pass read a2's 7 blocks first; asynchronous (vLLM's own loads), a2 joined a pass after
    # its copy had ended, which is as long as a pass without it.
    gaps: dict[bool, float] = {}
    for sync in (False, True):
        _, result, _, times = _run(sync=sync, with_decoder=True)
        a2 = {r.request_id: r for r in result.finished}["a2"]
        assert a2.first_token_time is not None
        i = times.index(a2.first_token_time)  # (the decoder was in that pass)
        gaps[sync] = times[i] - times[i - 1]
    # (The two passes differ only in the decoder's context by then, a few tokens.)
    assert gaps[True] - gaps[False] == pytest.approx(7 * BLOCK_S, rel=0.02)
