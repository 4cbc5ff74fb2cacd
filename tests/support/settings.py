"""`mocker serve`'s flags parsed as the command line does, for settings tests."""

from __future__ import annotations

import argparse

from mocker.config import EngineConfig
from mocker.settings import (
    ENGINE_OPTIONS,
    SERVER_OPTIONS,
    add_ignored_vllm_flags,
    add_options,
    engine_config_from,
    resolve,
)

ALL = ENGINE_OPTIONS + SERVER_OPTIONS


def parse_flags(argv: list[str]) -> argparse.Namespace:
    """`argv` parsed with every serve option and the ignored vLLM flags (absent: not set)."""
    parser = argparse.ArgumentParser()
    add_options(parser, SERVER_OPTIONS, "server")
    add_options(parser, ENGINE_OPTIONS, "engine")
    add_ignored_vllm_flags(parser)
    return parser.parse_args(argv)


def serve_config(*argv: str) -> EngineConfig:
    """The engine config `mocker serve` makes of these flags, no environment variable set."""
    return engine_config_from(resolve(parse_flags(list(argv)), ALL, environ={})[0])
