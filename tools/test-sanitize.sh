#!/usr/bin/env bash
# The compiled parts built with AddressSanitizer + UndefinedBehaviorSanitizer, and their
# differential tests (each part against its Python reference) run on those builds. The build
# happens in a scratch copy of the tracked tree, so .venv's own parts stay as they are; the
# sanitizer runtimes are preloaded (the interpreter itself is not instrumented). A finding
# stops the run with its report. Python's own allocations are not leak-checked (CPython keeps
# objects alive to exit by design), so leak detection is off; everything else is on.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DIFFERENTIAL=(tests/test_compiled.py tests/kv/test_compiled_pool.py tests/kv/test_hashing.py
	tests/engine/test_cpass.py tests/engine/test_stream.py tests/api/test_text_table.py
	tests/tiers/test_lru_order.py tests/tiers/test_channel.py tests/replay/test_prompts.py)
asan=$(gcc -print-file-name=libasan.so)
ubsan=$(gcc -print-file-name=libubsan.so)
if [ ! -e "$asan" ] || [ ! -e "$ubsan" ]; then
	echo "SKIPPED: gcc has no ASan/UBSan runtime here (libasan.so, libubsan.so): nothing was sanitized" >&2
	exit 0
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
git ls-files -z | xargs -0 tar -cf - | tar -xf - -C "$scratch"
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
start=$(date +%s)
(cd "$scratch" && CFLAGS="$flags" LDFLAGS="-fsanitize=address,undefined" \
	"$OLDPWD/$PY" setup.py --quiet build_ext --inplace >build.log 2>&1) ||
	{ cat "$scratch/build.log"; exit 1; }
cd "$scratch"
export LD_PRELOAD="$asan:$ubsan" PYTHONPATH="$scratch" MOCKER_COMPILED=1
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The parts under test are the scratch copy's, built with the sanitizers.
"$OLDPWD/$PY" - <<'PY'
import mocker
from mocker.compiled import PARTS, mode
mode()  # MOCKER_COMPILED=1: an error when a part failed to build
assert all(p.__file__.startswith(mocker.__path__[0]) for p in PARTS.values() if p), "not the scratch build"
print("sanitized parts:", ", ".join(sorted(PARTS)))
PY
# (--capture=sys: a sanitizer's report, written to fd 2 as the process aborts, reaches the log)
"$OLDPWD/$PY" -m pytest -q -p no:cacheprovider --capture=sys "${DIFFERENTIAL[@]}"
echo "test-sanitize: every part built with ASan + UBSan, its differential tests passed in $(( $(date +%s) - start )) s"
