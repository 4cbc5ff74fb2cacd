# mocker: a mock vLLM-style engine serving an OpenAI-compatible API.
#   docker build -t mocker:latest .
#   docker run -p 8000:8000 -p 5557:5557 mocker:latest --max-num-seqs 64
# Every flag is also an environment variable MOCKER_<FLAG> (MOCKER_MAX_NUM_SEQS=64).

# --- stage 1: build the wheel and install it, with its dependencies, into /opt/venv ---
FROM python:3.11-slim AS build

# A C compiler for mocker's compiled parts (mocker/kv/_cpool.c: the device block pool over
# packed arrays; mocker/kv/_chash.c: the fast hash chain; mocker/replay/_cprompts.c: replay
# prompts' mixing; mocker/api/_ctext.c: streamed chunks' text table; mocker/engine/_cpass.c:
# a pass's plain decode tokens and the draws ahead; mocker/tiers/_clru.c: a tier's LRU
# order; mocker/tiers/_clink.c: the channels between tiers); the runtime stage has none.
# (Its wheel builds without one too, on the Python code alone.)
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# Only what the wheel is built from (see .dockerignore); README.md is the package's readme.
COPY pyproject.toml setup.py README.md ./
COPY mocker ./mocker

# Every dependency ships manylinux wheels for CPython 3.11, so no compiler is needed for
# them; --only-binary makes a missing wheel an error here instead of a slow source build.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --only-binary=:all: /wheels/mocker-*.whl

# --- stage 2: the runtime image: the venv only, no build tools, no sources ---
FROM python:3.11-slim

# The venv's interpreter is a symlink to /usr/local/bin/python3, the same path in both stages.
COPY --from=build /opt/venv /opt/venv

# A fixed numeric uid, so Kubernetes' runAsNonRoot can check it without /etc/passwd.
RUN groupadd --system --gid 10001 mocker \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/mocker mocker

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MOCKER_HOST=0.0.0.0 \
    MOCKER_PORT=8000

USER 10001:10001
WORKDIR /home/mocker

# 8000: HTTP (OpenAI API, /health, /metrics); 5557: KV events (ZMQ PUB) when enabled.
EXPOSE 8000 5557

# The slim image has no curl: urllib raises (exit 1) on a refused connection or a non-2xx
# status, e.g. the 503 /health returns while draining or once the engine is dead.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('MOCKER_PORT', '8000'), timeout=4)"]

# `docker run IMAGE --max-num-seqs 64` appends flags to `mocker serve`.
ENTRYPOINT ["mocker", "serve"]
