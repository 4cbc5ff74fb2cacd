"""/openapi.json against schemathesis: the bodies it describes are the bodies the server takes,
and the answers it describes are the answers the server gives.

A real server on a loopback port, and schemathesis's coverage and fuzzing phases against its
own OpenAPI document for the routes that take a request body and the operations routes. The
findings that fail the test: any of schemathesis's checks but three that flag vLLM's own
behaviour (EXCLUDED, with why) — among them a 5xx (`not_a_server_error`, over schema-valid
and schema-violating requests alike) and a status code, media type, header or body the
document does not describe (the response-conformance checks) — and a route that refuses most
of the data its schema says is valid (schemathesis's acceptance counts for positive cases,
per route and phase, from its JSON report).

schemathesis lives in its own venv (tests/support/tool_venv.py); the test skips, loudly, where
pip cannot install it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import ServerThread, make_app
from tests.support.tool_venv import tool_venv

SCHEMATHESIS = ["schemathesis==4.32.5"]
BODY_ROUTES = [
    "POST /v1/completions",
    "POST /v1/chat/completions",
    "POST /v1/completions/render",
    "POST /v1/chat/completions/render",
    "POST /v1/responses",
    "POST /inference/v1/generate",
    "POST /tokenize",
    "POST /detokenize",
]
ROUTES = [*BODY_ROUTES, "GET /v1/models", "GET /health", "GET /ping", "POST /ping",
          "GET /version", "GET /metrics"]  # fmt: skip
PATHS = (
    r"^/(v1/(chat/)?completions(/render)?|v1/responses|inference/v1/generate|tokenize"
    r"|detokenize|v1/models|health|ping|version|metrics)$"
)
# Every check schemathesis has (no 5xx; the status code, media type, headers and body the
# document describes; unsupported methods, required headers, auth...), but three whose
# findings are vLLM's own behaviour, which the mock keeps:
# - negative_data_rejection: vLLM ignores an X-data-parallel-rank that is not an integer
#   (the request is load-balanced) and its pydantic models coerce loosely typed values;
# - positive_data_acceptance: rules JSON Schema cannot state (min_tokens <= max_tokens, a
#   prompt's length in tokens); _rejected() below bounds how often that happens instead;
# - allow_header_conformance: vLLM registers GET and POST /ping as two routes, so its 405
#   to OPTIONS /ping allows GET only, as the mock's does.
EXCLUDED = ("negative_data_rejection", "positive_data_acceptance", "allow_header_conformance")
PHASES = ("coverage", "fuzzing")
EXAMPLES = 40  # fuzzing cases per route (coverage's are as many as the schema has edges)
SEED = 20260601  # one fixed run: a finding reproduces, and a busy CI machine sees the same cases
# Schema-valid requests a route may still refuse: the few rules a JSON schema cannot state
# (min_tokens <= max_tokens, a prompt's length in tokens) refuse well under this share.
MIN_ACCEPTED = 0.5
TIMEOUT = 600.0  # seconds for the whole run; ~1 min on an idle 2-core machine


def _run(bin_dir: Path, url: str, workdir: Path) -> tuple[dict[str, Any], str]:
    report = workdir / "report.json"
    argv = [
        str(bin_dir / "schemathesis"), "run", f"{url}/openapi.json",
        "--phases", ",".join(PHASES),
        "--include-path-regex", PATHS,
        "--checks", "all",
        "--exclude-checks", ",".join(EXCLUDED),
        "--continue-on-failure",  # every case runs: the acceptance counts cover them all
        "--max-examples", str(EXAMPLES),
        "--seed", str(SEED),
        "--generation-database", "none",
        # Values schemathesis lifts from earlier responses to fill later requests get filtered
        # out (not sent) when they do not fit the schema; a few such draws in a row trip this
        # health check on a route whose own data is fine.
        "--suppress-health-check", "filter_too_much",
        # One worker: schemathesis's threads trip a CPython 3.11 bug in `ast` (a SystemError
        # in hypothesis's lambda descriptions) often enough to lose a route's phase.
        "--workers", "1",
        "--request-timeout", "60",
        "--no-color",
        "--report", "json", "--report-json-path", str(report),
    ]  # fmt: skip
    try:
        done = subprocess.run(
            argv,
            cwd=workdir,  # anything it leaves behind lands in the test's tmp dir
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        text = out.decode(errors="replace") if isinstance(out, bytes) else out
        pytest.fail(f"schemathesis did not finish in {TIMEOUT:.0f} s:\n{text[-4000:]}")
    output = done.stdout + done.stderr
    assert report.is_file(), f"schemathesis wrote no report (exit {done.returncode}):\n{output}"
    return json.loads(report.read_text()), output


def _rejected(rates: dict[str, dict[str, dict[str, int]]]) -> list[str]:
    """Every route and phase whose schema-valid requests were mostly refused (or not sent)."""
    problems = []
    for route in BODY_ROUTES:
        for phase in PHASES:
            counts = rates.get(route, {}).get(phase)
            if not counts:
                problems.append(f"{route} ({phase}): no schema-valid request was sent")
                continue
            # 404, 409 and 429 say nothing about the data; schemathesis counts them apart.
            total = counts["accepted"] + counts["rejected"]
            if total == 0 or counts["accepted"] / total < MIN_ACCEPTED:
                problems.append(f"{route} ({phase}): {counts['accepted']} of {total} accepted")
    return problems


def test_schemathesis_finds_no_server_error_and_the_schema_matches_validation(
    tmp_path: Path,
) -> None:
    bin_dir = tool_venv("schemathesis", SCHEMATHESIS)
    # A short context bounds each case's work: a valid request may ask for n choices of as
    # many tokens as the context leaves, and the server generates them all.
    with ServerThread(make_app(max_model_len=512)) as server:
        report, output = _run(bin_dir, server.url, tmp_path)
    tail = output[-6000:]
    assert report["test_cases"]["generated"] > 0, tail
    assert report["operations"]["tested"] == len(ROUTES), tail
    server_errors = [f for f in report["failures"] if f["code"] == "ST101"]
    assert not server_errors, f"schemathesis got 5xx answers: {server_errors}\n{tail}"
    assert not report["failures"], f"schemathesis found failures: {report['failures']}\n{tail}"
    assert not report["errors"], (
        f"schemathesis could not test everything: {report['errors']}\n{tail}"
    )
    assert not _rejected(report["valid_rates"]), (
        f"schema-valid requests refused: {_rejected(report['valid_rates'])}\n"
        f"{report['valid_rates']}\n{tail}"
    )
