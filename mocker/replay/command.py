"""`mocker replay`: flags, the progress bar, and the run from trace to report."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mocker.config import ConfigError, EngineConfig
from mocker.replay.records import ReplayResult
from mocker.replay.report import summarize, table, write_outputs
from mocker.replay.router import RoutingPolicy
from mocker.replay.runner import check_split, replay
from mocker.replay.trace import (
    SyntheticSpec,
    TraceRequest,
    load_trace,
    scale_trace,
    synthetic_trace,
)
from mocker.settings import ENGINE_OPTIONS, add_options, engine_config_from, resolve
from mocker.settings.deployment import listing, startup_lines

__all__ = [
    "MAX_ENGINES",
    "MAX_SYNTHETIC_REQUESTS",
    "add_replay_parser",
    "check_output_dir",
    "engine_values",
    "load_workload",
    "replay_config",
    "run_replay",
    "run_trace",
    "workload",
]

# A synthetic workload is drawn whole before the run: its size is bounded like a file's.
MAX_SYNTHETIC_REQUESTS = 1_000_000
MAX_ENGINES = 1024


def add_replay_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "replay",
        help="run a recorded or generated trace through the engine on a virtual clock",
        description="Replay a trace (Mooncake JSONL, or JSONL/CSV rows of arrival, input and "
        "output tokens) through the same engine core `mocker serve` runs, far faster than "
        "real time, and write per-request rows, a summary and plots.",
    )
    p.add_argument("trace", nargs="?", default=None, metavar="TRACE", help="trace file")
    p.add_argument(
        "--output-dir",
        default="replay-out",
        metavar="DIR",
        help="where requests.jsonl, summary.json and the plots go (replay-out)",
    )
    p.add_argument(
        "--trace-block-size",
        type=int,
        default=512,
        metavar="N",
        help="tokens per Mooncake hash id (512)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="multiply arrival gaps by X (0.5: twice the load)",
    )
    p.add_argument(
        "--max-requests",
        type=int,
        default=None,
        metavar="N",
        help="replay only the first N requests",
    )
    p.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="report malformed trace lines and go on (default: stop at the first)",
    )
    p.add_argument(
        "--num-engines", type=int, default=1, metavar="K", help="engine cores behind a router (1)"
    )
    p.add_argument(
        "--prefill-engines",
        type=int,
        default=0,
        metavar="N",
        help="P/D: the first N of the --num-engines prefill (NixlConnector kv_producer), the "
        "rest decode, pulling each prompt's KV over their link (0: no P/D)",
    )
    p.add_argument(
        "--router",
        default=RoutingPolicy.ROUND_ROBIN.value,
        choices=[r.value for r in RoutingPolicy],
        help="routing policy across engines (round-robin)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    _add_synthetic_args(p)
    add_options(p, ENGINE_OPTIONS, "engine (as mocker serve)")


def _add_synthetic_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("synthetic workload (instead of TRACE)")
    g.add_argument("--synthetic", action="store_true", help="generate the trace")
    g.add_argument("--num-requests", type=int, default=1000, help="requests (1000)")
    g.add_argument("--rate", type=float, default=None, help="Poisson arrivals per second (10)")
    g.add_argument(
        "--concurrency",
        type=int,
        default=None,
        metavar="N",
        help="closed loop instead of --rate: N users, each sending its next request when its "
        "previous one ends (also with a TRACE file: its arrival times are then ignored)",
    )
    g.add_argument("--input-len", type=int, default=1024, help="mean prompt tokens (1024)")
    g.add_argument("--output-len", type=int, default=128, help="mean output tokens (128)")
    g.add_argument(
        "--length-distribution",
        default="fixed",
        choices=("fixed", "uniform", "exponential"),
        help="(fixed)",
    )
    g.add_argument(
        "--shared-prefix-fraction",
        type=float,
        default=0.0,
        help="fraction of each prompt taken from a shared prefix (0)",
    )
    g.add_argument("--num-prefixes", type=int, default=4, help="distinct shared prefixes (4)")


def _check(args: argparse.Namespace) -> None:
    if args.synthetic == (args.trace is not None):
        raise ConfigError("give a TRACE file or --synthetic (one of them)")
    for name, lo in (("trace_block_size", 1), ("num_engines", 1), ("num_requests", 1),
                     ("input_len", 1), ("output_len", 1), ("num_prefixes", 1)):  # fmt: skip
        if getattr(args, name) < lo:
            raise ConfigError(f"invalid {name}={getattr(args, name)!r}: must be >= {lo}")
    if args.num_engines > MAX_ENGINES:
        raise ConfigError(
            f"invalid num_engines={args.num_engines!r}: at most {MAX_ENGINES} (each is a "
            "whole engine core with its KV pool)"
        )
    if args.synthetic and args.num_requests > MAX_SYNTHETIC_REQUESTS:
        raise ConfigError(
            f"invalid num_requests={args.num_requests!r}: at most {MAX_SYNTHETIC_REQUESTS:,} "
            "(each is drawn ahead of the run; replay a trace file for more)"
        )
    check_split(args.prefill_engines, args.num_engines)
    if args.max_requests is not None and args.max_requests < 1:
        raise ConfigError(f"invalid max_requests={args.max_requests!r}: must be >= 1")
    if not (math.isfinite(args.time_scale) and args.time_scale > 0):
        raise ConfigError(f"invalid time_scale={args.time_scale!r}: must be a finite number > 0")
    if args.rate is not None and args.concurrency is not None:
        raise ConfigError("give --rate or --concurrency, not both")
    if args.rate is not None and not (math.isfinite(args.rate) and args.rate > 0):
        raise ConfigError(f"invalid rate={args.rate!r}: must be a finite number > 0")
    if not math.isfinite(args.shared_prefix_fraction):
        raise ConfigError("invalid shared_prefix_fraction: must be in [0, 1]")
    if args.concurrency is not None and args.concurrency < 1:
        raise ConfigError(f"invalid concurrency={args.concurrency!r}: must be >= 1")
    if not 0.0 <= args.shared_prefix_fraction <= 1.0:
        raise ConfigError("invalid shared_prefix_fraction: must be in [0, 1]")


def load_workload(args: argparse.Namespace, seed: int) -> list[TraceRequest]:
    """The trace file's requests, or the synthetic workload, as drawn (arrivals unscaled)."""
    if args.synthetic:
        spec = SyntheticSpec(
            num_requests=args.num_requests,
            rate=10.0 if args.rate is None else args.rate,
            input_length=args.input_len,
            output_length=args.output_len,
            distribution=args.length_distribution,
            shared_prefix_fraction=args.shared_prefix_fraction,
            num_prefixes=args.num_prefixes,
            seed=seed,
        )
        return synthetic_trace(spec, args.trace_block_size)
    trace, skipped = load_trace(
        args.trace,
        trace_block_size=args.trace_block_size,
        skip_bad_lines=args.skip_bad_lines,
        max_requests=args.max_requests,
    )
    for problem in skipped:
        print(f"mocker: skipped {problem}", file=sys.stderr)
    return trace


def workload(
    args: argparse.Namespace, seed: int, loaded: list[TraceRequest] | None = None
) -> list[TraceRequest]:
    """The requests to replay: `loaded` (a trace file read once for many runs) or the
    workload `args` name, its arrival gaps scaled by --time-scale."""
    trace = load_workload(args, seed) if loaded is None or args.synthetic else loaded
    if args.time_scale != 1.0:
        try:
            trace = scale_trace(trace, args.time_scale)
        except ValueError as exc:
            raise ConfigError(f"invalid time_scale={args.time_scale!r}: {exc}") from None
    return trace


def check_output_dir(path: str) -> None:
    """The output directory exists (made now) and is writable, before the run spends time."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"invalid output_dir={path!r}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(f"invalid output_dir={path!r}: not writable")


def _check_synthetic(args: argparse.Namespace, max_model_len: int) -> None:
    """A synthetic workload's mean lengths fit the model (before any request is drawn)."""
    if args.input_len >= max_model_len:
        raise ConfigError(
            f"invalid input_len={args.input_len}: must be less than max_model_len ({max_model_len})"
        )
    if args.output_len > max_model_len:
        raise ConfigError(
            f"invalid output_len={args.output_len}: must be at most max_model_len ({max_model_len})"
        )


def engine_values(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The engine options' final values from a replay's flags (and MOCKER_* variables)."""
    engine_names = {o.dest for o in ENGINE_OPTIONS}
    given = argparse.Namespace(**{k: v for k, v in vars(args).items() if k in engine_names})
    values, _ = resolve(given, ENGINE_OPTIONS, environ=environ)
    return values


def replay_config(args: argparse.Namespace, values: Mapping[str, Any]) -> EngineConfig:
    """The engine configuration of a replay, its flags checked against it."""
    _check(args)
    config = engine_config_from(values)
    # A Mamba hybrid's block (e.g. 544 tokens) is sized by its state, not to divide a
    # trace's blocks: its engine blocks then straddle trace blocks (PromptBuilder).
    aligned = config.layout.has_mamba
    bad = config.block_size > args.trace_block_size or args.trace_block_size % config.block_size
    if bad and not aligned:
        raise ConfigError(
            f"--trace-block-size ({args.trace_block_size}) must be a multiple of --block-size "
            f"({config.block_size})"
        )
    if args.synthetic:
        _check_synthetic(args, config.scheduler.max_model_len)
    return config


def run_trace(
    args: argparse.Namespace,
    config: EngineConfig,
    trace: list[TraceRequest],
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Replay `trace` on the engines, router and loop `args` name."""
    return replay(
        trace,
        config,
        num_engines=args.num_engines,
        router=args.router,
        trace_block_size=args.trace_block_size,
        concurrency=args.concurrency,
        prefill_engines=args.prefill_engines,
        progress=progress,
    )


def run_replay(args: argparse.Namespace) -> int:
    values = engine_values(args)
    listed = listing(values)
    if listed is not None:
        print(listed)
        return 0
    config = replay_config(args, values)
    if not args.quiet:
        for line in startup_lines(config):
            print(f"mocker: {line}", file=sys.stderr)
    check_output_dir(args.output_dir)
    trace = workload(args, config.seed)
    show = not args.quiet and sys.stderr.isatty()
    if show:
        from rich.console import Console
        from rich.progress import Progress

        # On stderr, like every other message, so stdout keeps only the table.
        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("replaying", total=len(trace))
            result = run_trace(args, config, trace, lambda done: bar.update(task, completed=done))
    else:
        result = run_trace(args, config, trace)
    summary = summarize(result)
    out_dir = Path(args.output_dir)
    written = write_outputs(result, summary, out_dir, plots=not args.no_plots)
    if not args.quiet:
        print(table(summary))
        print("wrote " + ", ".join(str(p) for p in written))
    return 0
