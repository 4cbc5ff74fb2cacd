"""`mocker serve` timed from real-GPU data, as a client sees it: the KV capacity vLLM would have,
and a streamed TPOT within 10% of the one measured on real H100s."""

from __future__ import annotations

import random
import threading
import time

import httpx
import openai

from mocker.calibration import silicon_rows
from mocker.deployment import deployment_from, kv_capacity
from tests.support.servers import serve

SPEEDUP = 4.0
USERS = 4
ISL = OSL = 1024


def _row() -> tuple[float, float]:
    """The silicon table's Llama-3.1-70B FP8 run on 4 H100s, TP 4, 1k/1k at concurrency 4."""
    (row,) = [r for r in silicon_rows() if r.model == "meta-llama/Llama-3.1-70B"
              and r.gpu == "h100_sxm" and r.tensor_parallel_size == 4
              and (r.isl, r.osl, r.concurrency) == (ISL, OSL, USERS)]  # fmt: skip
    return row.ttft_ms, row.tpot_ms


def test_llama_70b_fp8_on_four_h100s_streams_at_the_measured_pace() -> None:
    # As the measured run's server: FP8 KV cache, 0.9 of the memory, max-num-seqs = users.
    args = ("meta-llama/Llama-3.1-70B", "--gpu", "h100_sxm", "--tensor-parallel-size", "4",
            "--quantization", "fp8", "--kv-cache-dtype", "fp8", "--gpu-memory-utilization",
            "0.9", "--max-num-seqs", str(USERS), "--speedup-ratio", str(SPEEDUP))  # fmt: skip
    _, measured_tpot = _row()
    rng = random.Random(0)
    tpots: list[float] = []
    with serve(*args) as (_, url):
        metrics = httpx.get(url + "/metrics").text
        dep = deployment_from("meta-llama/Llama-3.1-70B", "h100_sxm", tensor_parallel_size=4,
                              quantization="fp8", kv_cache_dtype="fp8",
                              gpu_memory_utilization=0.9)  # fmt: skip
        blocks = kv_capacity(dep, block_size=16, block_bytes=16 * 80 * 2 * 8 * 128,
                             max_num_batched_tokens=8192, max_num_seqs=USERS,
                             max_model_len=131072).num_gpu_blocks  # fmt: skip
        assert f'num_gpu_blocks="{blocks}"' in metrics and 'cache_dtype="fp8"' in metrics
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)

        def user(seed: int) -> None:
            # Random prompts of 0.8-1 times the lengths, as the measured run's client sent.
            prompt = [rng.randrange(1000, 100000) for _ in range(rng.randint(819, ISL))]
            stream = client.completions.create(
                model="meta-llama/Llama-3.1-70B", prompt=prompt, stream=True,
                max_tokens=rng.randint(819, OSL), extra_body={"ignore_eos": True},
            )  # fmt: skip
            times = [time.monotonic() for chunk in stream if chunk.choices]
            tpots.append((times[-1] - times[0]) / (len(times) - 1) * 1000 * SPEEDUP)

        with client:
            users = [threading.Thread(target=user, args=(i,)) for i in range(USERS)]
            for u in users:
                u.start()
            for u in users:
                u.join()
    assert len(tpots) == USERS
    tpot = sum(tpots) / len(tpots)
    assert abs(tpot - measured_tpot) <= 0.10 * measured_tpot, (tpot, measured_tpot)
