#!/usr/bin/env bash
# CI: tests/data/vllm_0.34.0_reference.json (what tests/test_vllm_reference.py holds mocker
# to) must be what vLLM 0.34.0's wheel says. The wheel's Python files are unpacked once into
# a cache; without PyPI the check is skipped, loudly.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${MOCKER_VLLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mocker/vllm-0.34.0}"
if [ ! -f "$cache/src/vllm/_version.py" ]; then
	rm -rf "$cache" && mkdir -p "$cache"
	if ! .venv/bin/python -m pip download --quiet --no-deps vllm==0.34.0 -d "$cache/wheels"; then
		echo "SKIPPED: vllm==0.34.0 could not be downloaded; the vLLM reference was NOT checked" >&2
		exit 0
	fi
	unzip -q "$cache"/wheels/vllm-*.whl 'vllm/*.py' -d "$cache/src"
	rm -rf "$cache/wheels"
fi
VLLM_SRC="$cache/src" .venv/bin/python tools/vllm_reference.py --check tests/data/vllm_0.34.0_reference.json
echo "vLLM 0.34.0 reference: up to date"
