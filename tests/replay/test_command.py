"""`mocker replay` end to end: outputs, table, bad input, exit codes, byte-identical reruns."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from mocker.cli import main


def trace_file(tmp_path: Path, extra: Sequence[str] = ()) -> Path:
    rows = [
        json.dumps(
            {
                "timestamp": i * 200,
                "input_length": 300 + 7 * i,
                "output_length": 5 + i,
                "hash_ids": [0, i % 3 + 1, 100 + i],
            }
        )
        for i in range(12)
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join([*rows, *extra]) + "\n")
    return path


def args(trace: Path, out: Path, *more: str) -> list[str]:
    return ["replay", str(trace), "--output-dir", str(out), "--trace-block-size", "128",
            "--max-model-len", "4096", *more]  # fmt: skip


def test_replay_writes_rows_summary_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(args(trace_file(tmp_path), out, "--num-engines", "2", "--router", "kv-aware")) == 0
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(r["status"] == "finished" for r in rows)
    assert {r["engine"] for r in rows} <= {0, 1}
    for key in ("arrival", "admit", "first_token", "finish", "ttft", "mean_itl",
                "cached_tokens_device", "cached_tokens_by_tier", "preemptions"):  # fmt: skip
        assert key in rows[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 12 and summary["engines"] == 2
    assert summary["prefix_hit_rate"]["device"] > 0  # hash id 0 is shared by all
    for key in ("ttft_s", "itl_s", "e2e_s"):
        assert set(summary[key]) == {"mean", "p50", "p90", "p99"}
    assert summary["sim_duration_s"] > 0 and summary["speedup_over_real_time"] > 0
    assert (out / "ttft_cdf.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "engines.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "TTFT" in printed and "prefix hits" in printed  # the table


def test_same_trace_and_seed_give_identical_rows(tmp_path: Path) -> None:
    trace = trace_file(tmp_path)
    for name in ("a", "b"):
        assert main(args(trace, tmp_path / name, "--quiet", "--no-plots", "--seed", "3")) == 0
    first = (tmp_path / "a" / "requests.jsonl").read_bytes()
    assert first == (tmp_path / "b" / "requests.jsonl").read_bytes()


def test_bad_line_stops_with_its_number_or_is_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = trace_file(tmp_path, extra=['{"timestamp": 5, "input_length": "many"}'])
    assert main(args(trace, tmp_path / "o", "--quiet")) == 2
    err = capsys.readouterr().err
    assert "trace.jsonl:13:" in err and "--skip-bad-lines" in err and "Traceback" not in err
    assert main(args(trace, tmp_path / "o", "--quiet", "--skip-bad-lines")) == 0
    assert "skipped" in capsys.readouterr().err
    assert len((tmp_path / "o" / "requests.jsonl").read_text().splitlines()) == 12


def test_rejected_requests_are_rows_and_the_run_exits_0(tmp_path: Path) -> None:
    trace = trace_file(tmp_path, extra=[json.dumps(
        {"timestamp": 9999, "input_length": 5000, "output_length": 1,
         "hash_ids": list(range(500, 540))})])  # fmt: skip
    out = tmp_path / "o"
    assert main(args(trace, out, "--quiet", "--no-plots")) == 0
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert rows[-1]["status"].startswith("rejected: ")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rejected"] == 1 and summary["finished"] == 12


def test_synthetic_and_setting_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s"
    assert main(["replay", "--synthetic", "--num-requests", "30", "--rate", "50",
                 "--input-len", "256", "--output-len", "8", "--shared-prefix-fraction", "0.5",
                 "--output-dir", str(out), "--quiet", "--no-plots"]) == 0  # fmt: skip
    assert json.loads((out / "summary.json").read_text())["finished"] == 30
    assert main(["replay", "--output-dir", str(out)]) == 2
    assert "TRACE file or --synthetic" in capsys.readouterr().err
    assert main(["replay", "--synthetic", "--time-scale", "0"]) == 2
    assert "time_scale" in capsys.readouterr().err
    assert main(["replay", "--synthetic", "--block-size", "48"]) == 2
    assert "block_size" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("more", "message"),
    [
        (["--time-scale", "inf"], "invalid time_scale=inf: must be a finite number > 0"),
        (["--time-scale", "nan"], "invalid time_scale=nan"),
        (["--time-scale", "1e308"], "beyond any finite time"),
    ],
)
def test_a_time_scale_that_is_no_time_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], more: list[str], message: str
) -> None:
    assert main(args(trace_file(tmp_path), tmp_path / "o", "--quiet", *more)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_an_output_dir_that_cannot_be_one_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("")
    for out in (taken, taken / "below"):
        assert main(args(trace_file(tmp_path), out, "--quiet")) == 2
        err = capsys.readouterr().err
        assert f"invalid output_dir={str(out)!r}" in err and "Traceback" not in err


def test_a_synthetic_workload_beyond_the_model_is_refused_before_it_is_drawn(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for flag in ("--input-len", "--output-len"):
        assert main(["replay", "--synthetic", flag, "1000000000", "--max-model-len", "4096",
                     "--output-dir", str(tmp_path / "o"), "--quiet"]) == 2  # fmt: skip
        err = capsys.readouterr().err
        assert "must be" in err and "max_model_len (4096)" in err and "Traceback" not in err
    assert main(["replay", "--synthetic", "--rate", "inf", "--output-dir",
                 str(tmp_path / "o")]) == 2  # fmt: skip
    assert "invalid rate=inf" in capsys.readouterr().err


def test_sizes_no_run_could_use_are_refused_before_anything_is_made(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = str(tmp_path / "o")
    for flag, value, message in [
        ("--num-engines", "1000000000000", "invalid num_engines=1000000000000: at most 1024"),
        ("--num-requests", "1000000000000", "invalid num_requests=1000000000000: at most"),
    ]:  # fmt: skip
        assert main(["replay", "--synthetic", flag, value, "--output-dir", out]) == 2
        assert message in capsys.readouterr().err
    # More users than requests: the rest would only wait, and none is made for them.
    assert main(["replay", "--synthetic", "--num-requests", "3", "--concurrency",
                 "1000000000000", "--output-dir", out, "--quiet", "--no-plots"]) == 0  # fmt: skip


def test_fixed_concurrency(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c"
    assert main(["replay", "--synthetic", "--num-requests", "24", "--concurrency", "3",
                 "--input-len", "200", "--output-len", "6", "--output-dir", str(out),
                 "--quiet", "--no-plots"]) == 0  # fmt: skip
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 24 and [r["arrival"] for r in rows[:3]] == [0.0, 0.0, 0.0]
    finishes = {r["finish"] for r in rows}
    assert all(r["arrival"] in finishes for r in rows[3:])  # each sent as another ended
    assert main(["replay", "--synthetic", "--rate", "5", "--concurrency", "2"]) == 2
    assert "--rate or --concurrency" in capsys.readouterr().err
    assert main(["replay", "--synthetic", "--concurrency", "0"]) == 2
    assert "concurrency" in capsys.readouterr().err


def test_kv_transfer_config_shares_obj_across_engines_by_hand(tmp_path: Path) -> None:
    # The runner's shared-obj scenario through the command line: vLLM's OffloadingConnector
    # config with a TieringOffloadingSpec obj tier, two engines round robin. A's prompt is
    # computed on engine 0 (stored to its CPU tier, cascaded to obj); A's prompt plus one
    # token lands on engine 1, which promotes the 16 blocks obj → CPU, loads them
    # CPU → device and prefills one token.
    block_bytes = 16 * 131072  # --block-size 16, the default Llama-3-8B shape: 2 MiB
    tiering = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 64 * block_bytes,
            "secondary_tiers": [
                {
                    "type": "obj",
                    "capacity_bytes": 1024 * block_bytes,
                    "read_gbps": 8,
                    "write_gbps": 4,
                    "latency_ms": 1,
                }
            ],
        },
    }
    rows = [(0, 256, [1, 2, 3, 4]), (100, 64, [11]), (200, 64, [21]), (1000, 257, [1, 2, 3, 4, 5])]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(
        json.dumps({"timestamp": t, "input_length": n, "output_length": 1, "hash_ids": ids}) + "\n"
        for t, n, ids in rows
    ))  # fmt: skip
    out = tmp_path / "out"
    argv = ["replay", str(trace), "--output-dir", str(out), "--trace-block-size", "64",
            "--block-size", "16", "--num-gpu-blocks-override", "64", "--max-model-len", "512",
            "--num-engines", "2", "--quiet", "--no-plots",
            "--kv-transfer-config", json.dumps(tiering)]  # fmt: skip
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    again = records[3]
    assert again["engine"] == 1
    assert (again["cached_tokens_by_tier"], again["cached_tokens_device"]) == ({"obj": 256}, 0)
    promote_s = 1e-3 + 16 * block_bytes / 8e9  # obj → CPU: latency + 16 blocks at 8 GB/s
    load_s = 16 * block_bytes / 32e9  # CPU → device at the default 32 GB/s
    assert again["admit"] == pytest.approx(1.0 + promote_s + load_s, abs=1e-9)
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["prefix_hit_rate"]) == {"device", "cpu", "obj"}
    prompt = sum(n for _, n, _ in rows)
    assert summary["prefix_hit_rate"]["obj"] == round(256 / prompt, 6)
    link_bytes = summary["offload"]["link_bytes"]
    assert link_bytes["obj->cpu"] == 16 * block_bytes  # read once, by engine 1
    assert link_bytes["cpu->obj"] >= 16 * block_bytes  # written by engine 0


def test_kv_transfer_config_mistake_names_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fs = {"type": "fs", "capacity_bytes": 1 << 30, "read_gbps": "fast"}
    extra = {"cpu_bytes_to_use": 1 << 30, "spec_name": "TieringOffloadingSpec",
             "secondary_tiers": [fs]}  # fmt: skip
    bad = {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra}
    argv = args(trace_file(tmp_path), tmp_path / "o", "--kv-transfer-config", json.dumps(bad))
    assert main(argv) == 2
    assert "read_gbps" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # nothing half-started


def test_prefill_engines_split_the_pool_and_report_pull_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    more = ("--num-engines", "3", "--prefill-engines", "1", "--no-plots")
    assert main(args(trace_file(tmp_path), out, *more)) == 0
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert all(r["prefill_engine"] == 0 and r["engine"] in (1, 2) for r in rows)
    assert all(r["pull_time"] > 0 for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["prefill_engines"] == 1 and summary["pull_s"]["p50"] > 0
    assert "P/D KV pull" in capsys.readouterr().out
    assert (
        main(args(trace_file(tmp_path), out, "--num-engines", "1", "--prefill-engines", "1")) == 2
    )


@pytest.mark.parametrize(
    ("shape", "groups", "hits"),
    [
        ("gpt-oss-20b", ["0:sliding_window", "1:full_attention"], True),
        # Its 544-token blocks (straddling the trace's 128-token ones) are longer than every
        # prompt (300..377 tokens): nothing can hit.
        ("qwen3-next-80b-a3b", ["0:mamba", "1:mamba", "2:mamba", "3:full_attention"], False),
    ],
)
def test_hybrid_shapes_report_kv_usage_by_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shape: str, groups: list[str], hits: bool
) -> None:
    out = tmp_path / "out"
    assert main(args(trace_file(tmp_path), out, "--model-shape", shape, "--no-plots",
                     "--num-gpu-blocks-override", "1000")) == 0  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 12
    usage = summary["kv_usage_by_group"]
    assert list(usage) == groups
    for u in usage.values():
        assert 0.0 < u["mean"] <= u["max"] <= 1.0
    # The requests share prefixes (hash ids 0 and 1..3): the device hits some.
    assert (summary["prefix_hit_rate"]["device"] > 0) is hits
    assert "KV usage by group (mean / peak): " + groups[0] in capsys.readouterr().out
