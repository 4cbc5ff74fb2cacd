#!/usr/bin/env bash
# `make test-busy` (not part of CI): does the suite pass on a busy machine?
#
# Clones the committed HEAD of this checkout into a fresh directory beside it
# (../<checkout>-busy-check, so ../shared resolves there as CI expects; BUSY_DIR overrides),
# starts two CPU hogs (`python3 -c 'while True: pass'`), and runs CI's entry point,
# `bash .ci/run`, in the clone RUNS times in a row (default 3), stopping at the first
# failure. One line per run (passed/FAILED, duration); each run's full output goes to a log
# under $LOGS (a fresh /tmp directory, printed). The hogs are stopped by their PIDs on any
# exit. Uncommitted changes are not tested (a warning says so).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUNS=${RUNS:-3}
DIR=$(realpath -m "${BUSY_DIR:-../$(basename "$ROOT")-busy-check}")
MARK=.test-busy-clone # marks a directory this script made (only such a one is removed)
COMMIT=$(git rev-parse HEAD)

HOGS=()
stop_hogs() {
	if ((${#HOGS[@]})); then
		kill "${HOGS[@]}" 2>/dev/null || true
		wait "${HOGS[@]}" 2>/dev/null || true
		HOGS=()
	fi
}
trap stop_hogs EXIT
trap 'exit 130' INT TERM # through the EXIT trap

if [[ -n $(git status --porcelain --untracked-files=no) ]]; then
	echo "test-busy: warning: uncommitted changes are not tested (the clone is of $COMMIT)" >&2
fi
if [[ -e $DIR ]]; then
	[[ -e $DIR/$MARK ]] || {
		echo "test-busy: $DIR exists and was not made by test-busy: remove it or set BUSY_DIR" >&2
		exit 2
	}
	rm -rf "$DIR"
fi
git clone --quiet "$ROOT" "$DIR"
git -C "$DIR" checkout --quiet --detach "$COMMIT"
touch "$DIR/$MARK"
LOGS=$(mktemp -d /tmp/test-busy.XXXXXX)
echo "test-busy: $COMMIT cloned into $DIR; logs in $LOGS"

for _ in 1 2; do
	# Spins until stopped, or until this script is gone (killed too hard to run its trap).
	python3 -c 'import os; parent = os.getppid()
while os.getppid() == parent: pass' &
	HOGS+=($!)
done
echo "test-busy: CPU hogs running: PIDs ${HOGS[*]} ($(nproc) cores)"

for ((run = 1; run <= RUNS; run++)); do
	log=$LOGS/run-$run.log
	start=$SECONDS
	if (cd "$DIR" && CI=true bash .ci/run </dev/null >"$log" 2>&1); then
		echo "test-busy: run $run/$RUNS passed in $((SECONDS - start)) s (load $(cut -d' ' -f1-3 /proc/loadavg))"
	else
		echo "test-busy: run $run/$RUNS FAILED after $((SECONDS - start)) s; the end of $log:"
		tail -n 40 "$log"
		exit 1
	fi
done
echo "test-busy: all $RUNS runs passed"
