# Two commands on a fresh machine: `make run` and `make test`. Both build .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-busy lint bench clean check-deploy

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "mocker needs Python >= 3.11 (set PYTHON=...)")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/mocker serve --port 8000

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q

# Not run by CI: .ci/run three times in a fresh clone of the committed HEAD while two CPU
# hogs keep the cores busy (tools/test-busy.sh; RUNS=N for another count).
test-busy:
	bash tools/test-busy.sh

# Deploy artifacts: hadolint, compose config, helm lint + kubernetes-validate, and a
# buildah/podman smoke test of the image (skipped loudly without root+apt). See deploy/check.sh.
check-deploy: $(STAMP)
	bash deploy/check.sh

bench: $(STAMP)
	$(BIN)/python bench/engine_step.py
	$(BIN)/python bench/serve_stream.py
	$(BIN)/python bench/offload.py
	$(BIN)/python bench/replay_speed.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
