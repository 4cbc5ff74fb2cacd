#!/usr/bin/env bash
# The compiled parts on the other supported interpreters: build them with each (3.12, 3.13)
# and run their differential tests against the Python reference (the full suite runs on the
# interpreter of .venv, in `make test`). An interpreter this machine lacks is a loud SKIPPED.
# The 3.12 run also takes the lowest uvicorn pyproject.toml allows (the others take the
# newest): mocker/api/direct_write.py and the compiled sink read uvicorn's HTTP cycle, and the
# API tests prove both ends of the range.
set -euo pipefail
cd "$(dirname "$0")/.."
DIFFERENTIAL=(tests/test_compiled.py tests/kv/test_compiled_pool.py tests/kv/test_hashing.py
	tests/engine/test_cpass.py tests/engine/test_stream.py tests/api/test_text_table.py
	tests/tiers/test_lru_order.py tests/tiers/test_channel.py tests/replay/test_prompts.py
	tests/api/test_gc_tuning.py tests/api/test_json_body.py tests/test_package.py)
UVICORN_TESTS=(tests/api)
find_python() {
	local v=$1 root
	if command -v "python$v" >/dev/null && "python$v" -c '' 2>/dev/null; then
		command -v "python$v"
		return
	fi
	root=$(pyenv root 2>/dev/null || true)
	for p in "$root"/versions/"$v".*/bin/"python$v"; do
		[ -x "$p" ] && { echo "$p"; return; }
	done
}
for v in 3.12 3.13; do
	py=$(find_python "$v")
	if [ -z "$py" ]; then
		echo "SKIPPED: Python $v is not on this machine: the compiled parts were not checked with it" >&2
		continue
	fi
	venv=".venv-$v"
	[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
	"$venv/bin/python" -m pip install --quiet --upgrade pip
	"$venv/bin/python" -m pip install --quiet -e '.[test]'
	tests=("${DIFFERENTIAL[@]}")
	if [ "$v" = 3.12 ]; then
		lowest=$("$venv/bin/python" -c 'import re, tomllib; deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]; print(next(re.search(r">=([0-9.]+)", d)[1] for d in deps if d.startswith("uvicorn")))')
		"$venv/bin/python" -m pip install --quiet "uvicorn[standard]==$lowest"
		tests+=("${UVICORN_TESTS[@]}")
		echo "Python $v: uvicorn $lowest (the lowest allowed)"
	fi
	"$venv/bin/python" -c 'from mocker.compiled import PARTS as p; n = [k for k, v in p.items() if v is None]; assert not n, f"not built: {n}"'
	"$venv/bin/python" -m pytest -q -p no:cacheprovider "${tests[@]}"
	echo "Python $v: every compiled part built, its differential tests passed"
done
