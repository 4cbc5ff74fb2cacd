"""Measurements: the silicon table's rows as their harnesses ran them, vllm bench results."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from mocker.calibration import Measurement, load_measurements, silicon_rows
from mocker.calibration.measurements import silicon_table
from mocker.errors import ConfigError


def test_the_silicon_tables_vllm_rows_by_harness() -> None:
    rows = silicon_rows()
    llama = [r for r in rows if r.model == "meta-llama/Llama-3.1-70B" and r.gpu == "h100_sxm"]
    assert len(llama) == 45
    r = next(r for r in llama if (r.tensor_parallel_size, r.isl, r.osl, r.concurrency)
             == (4, 1024, 1024, 16))  # fmt: skip
    # InferenceX: fp8 weights and KV cache, lengths in [0.8 L, L], max-num-seqs = C.
    assert (r.quantization, r.kv_cache_dtype, r.range_ratio, r.max_num_seqs) == (
        "fp8", "fp8", 0.8, 16)  # fmt: skip
    assert r.ttft_ms == pytest.approx(121.413273) and r.tpot_ms == pytest.approx(13.192186)
    qwen = next(r for r in rows if r.model == "Qwen/Qwen3-32B" and r.quantization is None)
    assert (qwen.kv_cache_dtype, qwen.range_ratio, qwen.max_num_seqs) == ("auto", 1.0, None)
    # Only aggregated vLLM runs: no disaggregated row, no other backend.
    assert len(rows) == sum(1 for _ in rows if _.model) and all(r.gpu for r in rows)


def test_a_workload_draws_the_lengths_as_the_client_did() -> None:
    m = Measurement("m", "h100_sxm", 1, concurrency=4, isl=1000, osl=100, ttft_ms=1.0,
                    tpot_ms=1.0, range_ratio=0.8)  # fmt: skip
    work = m.workload()
    assert len(work) == 40 and work == m.workload()  # seeded
    assert all(800 <= i <= 1000 and 80 <= o <= 100 for i, o in work)
    fixed = Measurement("m", "h100_sxm", 1, 2, 64, 8, 1.0, 1.0, num_prompts=5)
    assert fixed.workload() == [(64, 8)] * 5


def test_a_csv_is_filtered_by_model_and_gpu(tmp_path: Path) -> None:
    with silicon_table().open(newline="") as f:
        rows = list(csv.DictReader(f))
    path = tmp_path / "mine.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(r for r in rows if r["backend"] == "vllm")
    got = load_measurements([path], {"model": "Qwen/Qwen3-32B", "gpu": "h100_sxm"})
    assert got and {(m.model, m.gpu) for m in got} == {("Qwen/Qwen3-32B", "h100_sxm")}
    with pytest.raises(ConfigError, match="no measurement to calibrate against"):
        load_measurements([path], {"model": "nobody/none"})


def _bench(**changes: object) -> dict[str, object]:
    # The fields `vllm bench serve --save-result` writes that a closed loop needs.
    result: dict[str, object] = {"model_id": "meta-llama/Llama-3.1-8B-Instruct",
                                 "num_prompts": 3, "max_concurrency": 2, "completed": 3,
                                 "total_input_tokens": 300, "total_output_tokens": 30,
                                 "mean_ttft_ms": 50.0, "mean_tpot_ms": 8.0}  # fmt: skip
    return {**result, **changes}


def test_a_vllm_bench_result(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_bench(gpu="h200_sxm")))  # --metadata gpu=h200_sxm
    (m,) = load_measurements([path], {"gpu": "h100_sxm"})
    assert (m.model, m.gpu, m.concurrency, m.isl, m.osl) == (
        "meta-llama/Llama-3.1-8B-Instruct", "h200_sxm", 2, 100, 10)  # fmt: skip
    assert m.workload() == [(100, 10)] * 3
    path.write_text(json.dumps(_bench(input_lens=[90, 100, 110], output_lens=[9, 10, 11])))
    (m,) = load_measurements([path], {"gpu": "h100_sxm"})
    assert m.workload() == [(90, 9), (100, 10), (110, 11)]


@pytest.mark.parametrize(
    ("changes", "defaults", "message"),
    [
        ({"mean_ttft_ms": None}, {"gpu": "h100_sxm"}, "mean_ttft_ms=None must be a number"),
        ({"max_concurrency": None}, {"gpu": "h100_sxm"}, "needs completed requests and"),
        ({}, {}, "which GPU"),
    ],
)
def test_a_bench_result_that_cannot_be_replayed_says_why(
    tmp_path: Path, changes: dict[str, object], defaults: dict[str, object], message: str
) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_bench(**changes)))
    with pytest.raises(ConfigError, match=message):
        load_measurements([path], defaults)


def test_a_table_must_have_the_columns_and_sane_values(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("model_path,system,isl\nm,h100_sxm,10\n")
    with pytest.raises(ConfigError, match=r"no column.*tp_size.*batch_size"):
        load_measurements([path], {})
    header = "model_path,system,tp_size,isl,osl,batch_size,silicon_ttft_ms,silicon_tpot_ms\n"
    for row, message in (("m,h100_sxm,1,1000,100,0,50,8", r"t.csv:2: batch_size='0'"),
                         ("m,h100_sxm,1,1000,-5,4,50,8", "osl='-5'"),
                         ("m,h100_sxm,1,1000,100,4,50,0", "silicon_tpot_ms='0'"),
                         ("m,h100_sxm,1,1000,100", "batch_size=None")):  # fmt: skip
        path.write_text(header + row + "\n")
        with pytest.raises(ConfigError, match=message):
            load_measurements([path], {})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"completed": "abc"}, "completed='abc'"),
        ({"mean_tpot_ms": 0}, "mean_tpot_ms='0'"),
        ({"mean_ttft_ms": -5}, "mean_ttft_ms='-5'"),
        ({"tensor_parallel_size": "two"}, "tensor_parallel_size='two'"),
        ({"input_lens": [1, "x", 3], "output_lens": [2, 2, 2]}, "counts >= 1"),
        ({"quantization": 5}, "must be names"),
    ],
)
def test_a_bench_result_with_bad_values_is_refused(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_bench(**changes)))
    with pytest.raises(ConfigError, match=message):
        load_measurements([path], {"gpu": "h100_sxm"})
