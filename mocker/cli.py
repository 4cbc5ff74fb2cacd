"""Command line: `mocker serve` (the OpenAI server), `replay`, `sweep`, `calibrate`, `demo`,
`tokenizer export`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from mocker import __version__
from mocker.calibration.command import add_calibrate_parser, run_calibrate
from mocker.config import ConfigError, EngineConfig
from mocker.engine.core import EngineCore
from mocker.engine.live import LiveEngine
from mocker.engine.outputs import StepResult
from mocker.replay.command import add_replay_parser, run_replay
from mocker.replay.trace import TraceError
from mocker.request import EngineRequest, SamplingParams
from mocker.settings import (
    ENGINE_OPTIONS,
    SERVER_OPTIONS,
    add_ignored_vllm_flags,
    add_options,
    engine_config_from,
    resolve,
    server_settings_from,
)
from mocker.settings.deployment import listing, startup_lines
from mocker.sweep.command import add_sweep_parser, run_sweep
from mocker.timing import TimingSpec
from mocker.tokenizer import TokenizerError, export_tokenizer, load_tokenizer

__all__ = ["main"]


async def _demo(core: EngineCore, num_requests: int, concurrency: int) -> int:
    config = core.config
    preemptions = 0

    def count(result: StepResult) -> None:
        nonlocal preemptions
        preemptions += result.stats.num_preemptions

    engine = LiveEngine(core, on_step=count)
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
        f"preemptions {preemptions}"
    )
    return 0


def _serve(argv_args: argparse.Namespace) -> int:
    import uvicorn

    from mocker.api.app import create_app
    from mocker.api.fleet import build_fleet, check_replicas, raise_open_files
    from mocker.api.shutdown import DrainingServer

    given = argparse.Namespace(
        **{k: v for k, v in vars(argv_args).items() if k not in ("command", "model_tag", "config")}
    )
    values, warnings = resolve(given, ENGINE_OPTIONS + SERVER_OPTIONS, config_file=argv_args.config)
    if argv_args.model_tag is not None:
        values["model"] = argv_args.model_tag  # `vllm serve MODEL`: the positional wins
    for warning in warnings:
        print(f"mocker: warning: {warning}", file=sys.stderr)
    table = listing(values)
    if table is not None:
        print(table)
        return 0
    config = engine_config_from(values)
    settings = server_settings_from(values)
    for line in startup_lines(config):
        print(f"mocker: {line}", file=sys.stderr)
    tokenizer = load_tokenizer(settings.tokenizer, settings.chat_template)
    check_replicas(settings, config)
    raise_open_files(settings.replicas)
    # Bound here, before the app is built: with --port 0 the system picks the port, and the
    # app (the KV-event topic's {port}) and the start-up line below name the real one.
    listeners = _listeners(settings.host, settings.port, settings.replicas)
    ports = [s.getsockname()[1] for s in listeners]
    settings = replace(settings, port=ports[0])
    app: Any
    if settings.replicas == 1:
        app = create_app(settings, config, tokenizer)
        states = [app.state.mocker]
    else:
        app = build_fleet(settings, config, tokenizer, ports)
        states = list(app.states)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    print(
        f"mocker {__version__}: serving {', '.join(settings.served_model_names)} at "
        f"{settings.scheme}://{host}:{settings.port}/v1 (metrics at /metrics)",
        file=sys.stderr,
        flush=True,
    )
    if settings.replicas > 1:
        print(f"mocker: {settings.replicas} replicas on ports {_port_list(ports)}",
              file=sys.stderr, flush=True)  # fmt: skip
    server = DrainingServer(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            access_log=settings.access_log,
            root_path=settings.root_path,
            ssl_keyfile=settings.ssl_keyfile,
            ssl_certfile=settings.ssl_certfile,
            ssl_ca_certs=settings.ssl_ca_certs,
            ssl_cert_reqs=settings.ssl_cert_reqs,
            # After the drain every response has ended: connections close at once.
            timeout_graceful_shutdown=5,
        ),
        *states,
    )
    # uvicorn re-raises a caught signal to the handler installed before it once it has shut
    # down: make that a no-op, so a stop exits 0 with no traceback.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    server.run(sockets=listeners)
    # (uvicorn logs a failed start-up and returns: no traceback, but not a success)
    return 0 if server.started else 1


def _listeners(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` listening TCP sockets on host, at port, port + 1...; port 0: each on a free
    port the system picks. A port that cannot be bound closes the others."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    bound: list[socket.socket] = []
    for i in range(count):
        at = port + i if port else 0
        try:
            bound.append(socket.create_server((host, at), family=family, backlog=2048))
        except OSError as exc:
            for sock in bound:
                sock.close()
            raise ConfigError(f"cannot listen on {host}:{at}: {exc.strerror or exc}") from None
    return bound


def _port_list(ports: list[int]) -> str:
    """ "8000-8499" for a run of ports, else each of them."""
    if ports == list(range(ports[0], ports[0] + len(ports))):
        return f"{ports[0]}-{ports[-1]}"
    return ",".join(map(str, ports))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mocker", description=__doc__)
    parser.add_argument("--version", action="version", version=f"mocker {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible server (a drop-in for `vllm serve`)",
        description="Run the OpenAI-compatible server. Every setting can also come from an "
        "environment variable (shown with each flag) or a YAML file given with --config; "
        "a flag beats the environment, which beats the file.",
    )
    serve.add_argument(
        "model_tag", nargs="?", default=None, metavar="MODEL", help="model name, as `vllm serve`"
    )
    serve.add_argument(
        "--config", default=None, metavar="FILE", help="YAML file of settings (flag names as keys)"
    )
    add_options(serve, SERVER_OPTIONS, "server")
    add_options(serve, ENGINE_OPTIONS, "engine (shared with mocker replay)")
    add_ignored_vllm_flags(serve)

    add_replay_parser(sub)
    add_calibrate_parser(sub)
    add_sweep_parser(sub)

    tok = sub.add_parser("tokenizer", help="tokenizer tools")
    tok_sub = tok.add_subparsers(dest="tokenizer_command", required=True)
    export = tok_sub.add_parser(
        "export",
        help="write a Hugging Face tokenizer folder with the chat template the server uses",
        description="Write DIR/tokenizer.json and DIR/tokenizer_config.json (with chat_template, "
        "bos_token, eos_token), so a client's --tokenizer DIR renders chat exactly as "
        "`mocker serve` does.",
    )
    export.add_argument("dir", metavar="DIR", help="the folder to write")
    export.add_argument(
        "--tokenizer", default=None, metavar="PATH", help="as mocker serve (default: bundled)"
    )
    export.add_argument("--chat-template", default=None, metavar="FILE", help="as mocker serve")

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
        help="a measured profile (.npz, Dynamo's layout) or a correction (.json, from "
        "mocker calibrate); default: the polynomial model",
    )
    demo.add_argument("--seed", type=int, default=0, help="seed for hashes and tokens (0)")
    return parser


class _LineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"mocker: {record.levelname.lower()}: {record.getMessage()}"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to sys.stderr as it is when a record comes, not as it was when main() first
    ran (a later redirect, or a test's capture, would leave a closed stream behind)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        pass


def _log_to_stderr() -> None:
    """mocker's own warnings (a timing fallback, a flag it adjusted) as one line each."""
    logger = logging.getLogger("mocker")
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(_LineFormatter())
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
        logger.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _log_to_stderr()
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "replay":
            return run_replay(args)
        if args.command == "calibrate":
            return run_calibrate(args)
        if args.command == "sweep":
            return run_sweep(args)
        if args.command == "tokenizer":
            print(export_tokenizer(args.dir, args.tokenizer, args.chat_template))
            return 0
        for name in ("num_requests", "concurrency"):
            if getattr(args, name) < 1:
                raise ConfigError(f"invalid {name}={getattr(args, name)!r}: must be >= 1")
        core = EngineCore(
            EngineConfig.of(
                speedup_ratio=args.speedup_ratio,
                num_gpu_blocks=args.num_gpu_blocks_override,
                timing=TimingSpec.with_profile("polynomial", None, args.timing_profile),
                seed=args.seed,
            )
        )
    except (ConfigError, TokenizerError, TraceError) as exc:
        print(f"mocker: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_demo(core, args.num_requests, args.concurrency))
