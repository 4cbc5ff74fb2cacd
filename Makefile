# Two commands on a fresh machine: `make run` and `make test`. Both build .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two install stamps: `run` needs mocker and its runtime dependencies only; `test` (and the
# targets that run tests or benchmarks) adds the test extras (ruff, pytest, httpx, openai...).
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: run test test-busy test-sanitize lint bench clean check-deploy docs

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "mocker needs Python >= 3.11 (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# setup.py and the C sources: the compiled pool (mocker/kv/_cpool.c), the fast hash chain
# (mocker/kv/_chash.c), replay prompts' mixing (mocker/replay/_cprompts.c), the streamed
# chunks' text table (mocker/api/_ctext.c), a pass's plain decode tokens
# (mocker/engine/_cpass.c), a tier's LRU order (mocker/tiers/_clru.c) and the channels between
# tiers (mocker/tiers/_clink.c), built in place by the editable install when a C compiler is
# there (mocker runs without them, on their Python code).
C_SOURCES := mocker/kv/_cpool.c mocker/kv/_chash.c mocker/replay/_cprompts.c mocker/api/_ctext.c \
	mocker/engine/_cpass.c mocker/tiers/_clru.c mocker/tiers/_clink.c mocker/_cfields.h \
	mocker/_cmixing.h
$(RUN_STAMP): pyproject.toml setup.py $(C_SOURCES) | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# The test install is a superset of the run install, so it renews the run stamp too.
$(TEST_STAMP): pyproject.toml setup.py $(C_SOURCES) | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(RUN_STAMP)

run: $(RUN_STAMP)
	$(BIN)/mocker serve --port 8000

test: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	@$(BIN)/python -c 'from mocker.compiled import PARTS as p; n = [k for k, v in p.items() if v is None]; print("compiled parts:", f"NOT BUILT: {n} (no C compiler at install?): their Python code serves" if n else "all built")'
	$(BIN)/python -m pytest -q
	# Again on the Python pool, the compiled one's reference (MOCKER_COMPILED: auto by default).
	MOCKER_COMPILED=0 $(BIN)/python -m pytest -q

# The compiled parts built with ASan + UBSan in a scratch copy, their differential tests run
# on those builds (tools/test-sanitize.sh; CI runs it).
test-sanitize: $(TEST_STAMP)
	bash tools/test-sanitize.sh

# Not run by CI: .ci/run three times in a fresh clone of the committed HEAD while two CPU
# hogs keep the cores busy (tools/test-busy.sh; RUNS=N for another count).
test-busy:
	bash tools/test-busy.sh

# The documentation site (docs/, mkdocs.yml): a broken link or anchor fails the build.
$(DOCS_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"])' \
		| xargs $(BIN)/python -m pip install --quiet
	touch $@

docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

# Deploy artifacts: hadolint, compose config, helm lint + kubernetes-validate, and a
# buildah/podman smoke test of the image (skipped loudly without root+apt). See deploy/check.sh.
check-deploy: $(TEST_STAMP)
	bash deploy/check.sh

bench: $(TEST_STAMP)
	$(BIN)/python bench/engine_step.py
	$(BIN)/python bench/serve_stream.py
	$(BIN)/python bench/request_cost.py
	$(BIN)/python bench/offload.py
	$(BIN)/python bench/tiers.py
	$(BIN)/python bench/replay_speed.py
	$(BIN)/python bench/hashing.py
	$(BIN)/python bench/hybrid_step.py
	$(BIN)/python bench/metrics_scrape.py
	$(BIN)/python bench/compiled_parts.py

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache .ruff_cache .hypothesis
