"""The command line: the demo runs the live engine; bad settings exit 2 with a message."""

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from mocker.cli import main
from tests.support.servers import serve, stderr_of


def test_demo_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["demo", "--num-requests", "4", "--concurrency", "2", "--speedup-ratio", "100"]) == 0
    )
    out = capsys.readouterr().out
    assert "4 requests, 256 tokens" in out and "TTFT median" in out


def test_bad_setting_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--speedup-ratio", "0"]) == 2
    assert "speedup_ratio" in capsys.readouterr().err
    # A ratio this small would make a pass last longer than the universe has: refused.
    assert main(["demo", "--speedup-ratio", "1e-300"]) == 2
    assert "invalid speedup_ratio=1e-300: must be in [0.001, 1e+12]" in capsys.readouterr().err
    for flag in ("--num-requests", "--concurrency"):  # (0 users would wait forever)
        assert main(["demo", flag, "0"]) == 2
        err = capsys.readouterr().err
        assert f"invalid {flag[2:].replace('-', '_')}=0: must be >= 1" in err
        assert "Traceback" not in err
    assert main(["demo", "--timing-profile", "/nonexistent.npz"]) == 2
    assert "timing_profile" in capsys.readouterr().err


def test_a_bad_pool_choice_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOCKER_COMPILED", "bogus")
    assert main(["demo", "--num-requests", "1"]) == 2
    assert "MOCKER_COMPILED='bogus': expected one of auto, 0, 1" in (capsys.readouterr().err)


def test_serve_bad_settings_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["serve", "--max-num-seqs", "0"]) == 2
    assert "max_num_seqs" in capsys.readouterr().err
    assert main(["serve", "--tokenizer", str(tmp_path)]) == 2
    assert "no tokenizer.json" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_num_seqs: lots\n")
    assert main(["serve", "--config", str(bad)]) == 2
    assert "max_num_seqs" in capsys.readouterr().err
    assert main(["serve", "--shutdown-timeout", "-1"]) == 2
    assert "invalid shutdown_timeout" in capsys.readouterr().err


def test_serve_bad_kv_events_config_exits_2_naming_the_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["serve", "--kv-events-config", '{"enable_kv_cache_events": tru}']) == 2
    assert "kv_events_config: not valid JSON" in capsys.readouterr().err
    assert main(["serve", "--kv-events-config", '{"hwm": "many"}']) == 2
    assert "kv_events_config.hwm='many'" in capsys.readouterr().err
    assert main(["serve", "--kv-events-config", '{"enable_kv_cache_events": 1}']) == 2
    assert "kv_events_config.enable_kv_cache_events" in capsys.readouterr().err
    assert main(["serve", "--kv-events-config", '{"topic": "kv@{pod_ip}"}']) == 2
    assert "unknown placeholder {pod_ip}" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"  # in a YAML file the config may be a mapping
    bad.write_text("kv_events_config:\n  enable_kv_cache_events: true\n  endpoit: tcp://*:1\n")
    assert main(["serve", "--config", str(bad)]) == 2
    assert "unknown key 'endpoit'" in capsys.readouterr().err


def test_serve_help_explains_every_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mocker", "serve", "--help"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    for flag in (
        "--model",
        "--served-model-name",
        "--max-num-queued-reqs",
        "--api-key",
        "--no-enable-prefix-caching",
        "--speedup-ratio",
        "--timing-profile",
        "MOCKER_MAX_NUM_SEQS",
        "--gpu-memory-utilization",
        "--config",
        "--kv-events-config",
        "--kv-events-format",
    ):
        assert flag in out, flag  # fmt: skip


def test_mocker_serve_process_with_env_yaml_and_positional_model(tmp_path: Path) -> None:
    """`python -m mocker serve MODEL` as users run it: settings from a YAML file, the
    environment and flags, vLLM flags warned about, a request served, SIGTERM ends it."""
    cfg = tmp_path / "mocker.yaml"
    cfg.write_text("max_model_len: 2048\nspeedup-ratio: 100\nmax_num_seqs: 4\n")
    env = {**os.environ, "MOCKER_SERVED_MODEL_NAME": "served-name", "MOCKER_MAX_NUM_SEQS": "8"}
    args = ("org/model", "--config", str(cfg), "--timing-model", "polynomial", "--dtype", "auto")
    with serve(*args, env=env) as (proc, base):  # --port 0: the start-up line names the port
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", base) and not base.endswith(":0")
        card = httpx.get(base + "/v1/models").json()["data"][0]
        assert card["id"] == "served-name" and card["root"] == "org/model"
        assert card["max_model_len"] == 2048
        r = httpx.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert r.json()["usage"]["completion_tokens"] == 3
        assert 'num_gpu_blocks="16384"' in httpx.get(base + "/metrics").text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        err = stderr_of(proc)
    assert "ignoring --dtype" in err
    assert f"serving served-name at {base}/v1" in err
    assert "Traceback" not in err


def test_tokenizer_export_writes_a_folder_clients_load(tmp_path: Path) -> None:
    out = tmp_path / "tok"
    assert main(["tokenizer", "export", str(out)]) == 0
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["chat_template"] and (out / "tokenizer.json").is_file()
    assert main(["tokenizer", "export", str(out), "--tokenizer", str(tmp_path / "none")]) == 2


def test_serve_behind_a_root_path() -> None:
    """vLLM's --root-path is uvicorn's: the proxy strips the prefix, the OpenAPI document
    names it for clients generated from it."""
    with serve("--root-path", "/proxy", "--speedup-ratio", "100") as (proc, base):
        assert httpx.get(base + "/v1/models").status_code == 200
        r = httpx.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        assert httpx.get(base + "/openapi.json").json()["servers"] == [{"url": "/proxy"}]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def _self_signed(tmp_path: Path) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip(
            "openssl is not installed: no certificate for the TLS test (apt install openssl)"
        )
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(key), str(cert)


def test_serve_over_tls(tmp_path: Path) -> None:
    """vLLM's --ssl-keyfile/--ssl-certfile: HTTPS, streams included (their chunks go straight
    to the TLS transport)."""
    key, cert = _self_signed(tmp_path)
    with serve("--ssl-keyfile", key, "--ssl-certfile", cert, "--speedup-ratio", "100") as (
        proc,
        base,
    ):
        assert base.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=cert)
        with httpx.Client(base_url=base, verify=trusted, timeout=30) as https:
            assert https.get("/v1/models").status_code == 200
            body = {"prompt": "hi", "max_tokens": 5, "stream": True}
            text = https.post("/v1/completions", json=body).text
        assert text.count("data: ") == 6 and text.endswith("data: [DONE]\n\n")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_tls_mistakes_stop_start_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "key.pem"
    key.write_text("x")
    assert main(["serve", "--ssl-keyfile", str(key)]) == 2
    assert "set both --ssl-keyfile and --ssl-certfile" in capsys.readouterr().err
    missing = str(tmp_path / "none.pem")
    assert main(["serve", "--ssl-keyfile", str(key), "--ssl-certfile", missing]) == 2
    assert f"invalid ssl_certfile='{missing}': not a readable file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--gpu", "h900"], "mocker: invalid gpu='h900': must be one of a100_pcie"),
        (["serve", "--model", "org/none"], "mocker: invalid model='org/none'"),
        (["serve", "--model", "Qwen/Qwen3-32B", "--tensor-parallel-size", "3"],
         "mocker: invalid tensor_parallel_size=3"),
        (["serve", "--quantization", "int2"], "mocker: invalid quantization='int2'"),
        (["replay", "--synthetic", "--quantization", "nvfp4"],
         "mocker: invalid quantization='nvfp4' on gpu='h100_sxm'"),
        (["calibrate", "/nonexistent.json"], "mocker: invalid measurements='/nonexistent.json'"),
    ],
)  # fmt: skip
def test_a_bad_deployment_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err


def test_gpu_and_model_lists(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--gpu", "list"]) == 0
    out = capsys.readouterr().out
    assert "h100_sxm" in out and "b200_sxm" in out and "GiB" in out
    assert main(["replay", "--model", "list"]) == 0
    assert "openai/gpt-oss-120b" in capsys.readouterr().out


def test_calibrate_checks_its_output_before_fitting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = tmp_path / "r.json"
    result.write_text(json.dumps({"model_id": "meta-llama/Llama-3.1-8B-Instruct",
                                  "completed": 2, "max_concurrency": 1, "total_input_tokens": 20,
                                  "total_output_tokens": 8, "mean_ttft_ms": 10.0,
                                  "mean_tpot_ms": 5.0}))  # fmt: skip
    out = tmp_path / "none" / "c.json"
    assert main(["calibrate", str(result), "--gpu", "h100_sxm", "--output", str(out)]) == 2
    assert "invalid output=" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["70000", "65535", "abc"])
def test_a_side_channel_port_beyond_the_ports_stops_start_up(port: str) -> None:
    # Rank 1 of two would listen on 65536: no port. (A bound port would mean a server that
    # started: the run would time out instead.)
    env = {**os.environ, "VLLM_NIXL_SIDE_CHANNEL_PORT": port}
    nixl = '{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}'
    done = subprocess.run(
        [sys.executable, "-m", "mocker", "serve", "--port", "0", "--timing-model", "polynomial",
         "--data-parallel-size", "2", "--kv-transfer-config", nixl],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"VLLM_NIXL_SIDE_CHANNEL_PORT={port!r} is not a port number" in done.stderr
    assert "Traceback" not in done.stderr
