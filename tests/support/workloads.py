"""Random workloads for property tests: pool geometries, arrivals, shared prefixes, aborts."""

from __future__ import annotations

import random
from typing import Any

from mocker.engine.core import EngineCore
from mocker.engine.virtual import Abort, VirtualDriver, VirtualRun
from mocker.request import EngineRequest, SamplingParams


def random_geometry(rng: random.Random, block_size: int) -> dict[str, Any]:
    """A small random pool and batch shape for `random_requests` (64-token context)."""
    max_seqs = rng.randint(2, 8)
    return {
        "block_size": block_size,
        "num_gpu_blocks": rng.randint(20, 48),
        "max_num_seqs": max_seqs,
        "max_num_batched_tokens": rng.choice([max(max_seqs, 24), 64, 128]),
        "max_model_len": 64,
    }


def random_requests(rng: random.Random) -> tuple[list[EngineRequest], list[Abort]]:
    """20-50 Poisson arrivals (60/s) sharing four 24-token prefixes in part, 1-12 output
    tokens each, about 15% of them aborted soon after arrival (for property tests)."""
    prefixes = [[rng.randrange(10, 5000) for _ in range(24)] for _ in range(4)]
    requests: list[EngineRequest] = []
    aborts: list[Abort] = []
    t = 0.0
    for i in range(rng.randint(20, 50)):
        t += rng.expovariate(60.0)
        shared = rng.choice(prefixes)[: rng.choice([0, 8, 16, 24])]
        suffix = [rng.randrange(10, 5000) for _ in range(rng.randint(1, 16))]
        requests.append(
            EngineRequest(
                f"r{i}",
                shared + suffix,
                SamplingParams(max_tokens=rng.randint(1, 12), ignore_eos=True),
                arrival_time=t,
            )
        )
        if rng.random() < 0.15:
            aborts.append(Abort(t + rng.uniform(0.0, 0.05), f"r{i}"))
    return requests, aborts


def two_rounds(core: EngineCore, prompts: int = 8, tokens: int = 600) -> dict[str, Any]:
    """`prompts` distinct prompts of `tokens` tokens, one output token each, sent twice (round
    r at 10 s × r, 0.5 s apart): each request's finished record, by id (`rR-K`)."""
    requests = [
        EngineRequest(f"r{round_}-{k}", [1000 * (k + 1) + j for j in range(tokens)],
                      SamplingParams(max_tokens=1, ignore_eos=True), 10.0 * round_ + 0.5 * k)
        for round_ in range(2) for k in range(prompts)
    ]  # fmt: skip
    run = VirtualRun()
    for _ in VirtualDriver(core).steps(requests, run=run):
        pass
    return {r.request_id: r for r in run.finished}
