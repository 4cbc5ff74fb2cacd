"""Command line: `mocker demo` (a short live engine run); `serve` and `replay` come later."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Sequence

from mocker import __version__
from mocker.config import ConfigError, EngineConfig
from mocker.engine.core import EngineCore
from mocker.engine.live import LiveEngine
from mocker.request import EngineRequest, SamplingParams

__all__ = ["main"]


async def _demo(core: EngineCore, num_requests: int, concurrency: int) -> int:
    config = core.config
    engine = LiveEngine(core)
    engine.start()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    gate = asyncio.Semaphore(concurrency)
    ttfts: list[float] = []
    e2es: list[float] = []
    tokens = 0
    shared = list(range(1000, 1512))  # half the requests share a 512-token system prompt

    async def one(i: int) -> None:
        nonlocal tokens
        unique = [(i * 7919 + j) % 120000 + 2000 for j in range(512)]
        prompt = shared + unique if i % 2 == 0 else unique + shared
        async with gate:
            start = loop.time()
            first = None
            spec = EngineRequest(f"demo-{i}", prompt, SamplingParams(max_tokens=64))
            async for out in engine.generate(spec):
                if first is None:
                    first = loop.time() - start
                tokens += len(out.new_token_ids)
            ttfts.append(first or 0.0)
            e2es.append(loop.time() - start)

    await asyncio.gather(*(one(i) for i in range(num_requests)))
    wall = loop.time() - t0
    await engine.stop()
    print(
        f"{num_requests} requests, {tokens} tokens in {wall:.2f}s wall "
        f"(speedup {config.speedup_ratio:g}): "
        f"TTFT median {statistics.median(ttfts) * 1000:.1f} ms, "
        f"e2e median {statistics.median(e2es) * 1000:.1f} ms, "
        f"preemptions {engine.core.scheduler.num_preemptions}"
    )
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mocker", description=__doc__)
    parser.add_argument("--version", action="version", version=f"mocker {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a short workload through the live engine")
    demo.add_argument("--num-requests", type=int, default=64, help="requests to send (64)")
    demo.add_argument("--concurrency", type=int, default=16, help="requests in flight (16)")
    demo.add_argument(
        "--speedup-ratio",
        type=float,
        default=4.0,
        help="divide every simulated duration by this (4)",
    )
    demo.add_argument(
        "--num-gpu-blocks-override", type=int, default=16384, help="device KV blocks (16384)"
    )
    demo.add_argument(
        "--timing-profile",
        default=None,
        metavar="FILE",
        help="NPZ latency profile (Dynamo layout); default: the polynomial model",
    )
    demo.add_argument("--seed", type=int, default=0, help="seed for hashes and tokens (0)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        core = EngineCore(
            EngineConfig(
                speedup_ratio=args.speedup_ratio,
                num_gpu_blocks=args.num_gpu_blocks_override,
                timing_profile=args.timing_profile,
                seed=args.seed,
            )
        )
    except ConfigError as exc:
        print(f"mocker: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_demo(core, args.num_requests, args.concurrency))
