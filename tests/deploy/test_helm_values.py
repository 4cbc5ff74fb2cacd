"""Every flag of `mocker serve --help` has a Helm value and is rendered as its MOCKER_* env var."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from mocker import cli
from mocker.settings import ALL_OPTIONS, ENV_PREFIX, IGNORED_VLLM_FLAGS

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy/helm/mocker"
SECRETS = {"api_key", "admin_token"}  # passed through a Secret, not the settings loop
NOT_SETTINGS = {"help", "config"}  # --config names the YAML file the settings would be in


def help_flags() -> set[str]:
    """The dests of every flag `mocker serve --help` lists, less the ignored vLLM ones."""
    out = io.StringIO()
    # Wide enough that argparse never wraps a line (it would break a flag at a hyphen).
    with (
        mock.patch.dict(os.environ, {"COLUMNS": "10000"}),
        contextlib.redirect_stdout(out),
        pytest.raises(SystemExit),
    ):
        cli.main(["serve", "--help"])
    flags = set(re.findall(r"(?<![\w-])--([a-z][a-z0-9-]*)", out.getvalue()))
    # --no-enable-x is the negative of --enable-x (argparse.BooleanOptionalAction).
    flags = {f.removeprefix("no-") if f.removeprefix("no-") in flags else f for f in flags}
    dests = {f.replace("-", "_") for f in flags}
    return dests - NOT_SETTINGS - set(IGNORED_VLLM_FLAGS)


def env_name(dest: str) -> str:
    option = ALL_OPTIONS.get(dest)
    return option.env if option is not None else ENV_PREFIX + dest.upper()


def settings() -> dict[str, Any]:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    settings: dict[str, Any] = values["settings"]
    return settings


def deployment_template() -> str:
    return (CHART / "templates/deployment.yaml").read_text(encoding="utf-8")


def test_help_lists_the_known_flags() -> None:
    flags = help_flags()
    assert {"max_num_seqs", "kv_events_config", "enable_prefix_caching", "host"} <= flags
    assert set(ALL_OPTIONS) <= flags


def test_every_flag_has_a_value() -> None:
    missing = sorted(help_flags() - set(settings()))
    assert missing == []


def test_every_value_is_a_flag() -> None:
    unknown = sorted(set(settings()) - help_flags())
    assert unknown == []  # a misspelt key would set an env var mocker never reads


def test_every_value_is_rendered_as_its_env_var() -> None:
    template = deployment_template()
    # The loop that turns each non-null key of the role's settings (`settings`, with P/D
    # each role's merged over them) into MOCKER_<KEY>, but the secrets.
    loop = re.search(
        r"range \$key, \$value := \$role\.settings \}\}(?P<body>.*?)\{\{-? end \}\}\s*"
        r"\{\{-? end \}\}",
        template,
        re.S,
    )
    assert loop is not None, "no range over the role's settings in the deployment"
    body = loop["body"]
    assert "- name: MOCKER_{{ upper $key }}" in body
    listed = re.search(r"has \$key \(list ([^)]*)\)", body)
    assert listed is not None
    excluded = set(re.findall(r'"(\w+)"', listed[1]))
    assert excluded == SECRETS
    for key in settings():
        expected = env_name(key)
        if key in SECRETS:
            # Rendered by hand, from the Secret.
            entry = re.search(rf"- name: {expected}\s+valueFrom:\s+secretKeyRef:", template)
            assert entry is not None, f"{expected} is not read from a Secret"
        else:
            assert ENV_PREFIX + key.upper() == expected, key


def _sample(key: str) -> Any:
    """A plausible value for a setting, by its option kind."""
    option = ALL_OPTIONS.get(key)
    special = {
        "host": "0.0.0.0",
        "port": 8000,
        "data_parallel_size": 2,
        "failure_types": [429, "abort"],
    }
    if key in special:
        return special[key]
    if option is None:
        return "1"
    if option.kind == "json":
        return {"enable_kv_cache_events": True, "endpoint": "tcp://*:5557", "topic": "t"}
    if option.choices:
        return option.choices[-1]
    return {"int": 2, "float": 0.5, "bool": False, "flag": True, "names": ["a", "b"]}.get(
        option.kind, "x"
    )


def _helm() -> str | None:
    candidates = [
        os.environ.get("HELM"),
        str(ROOT / ".deploy-tools/bin/helm"),
        shutil.which("helm"),
    ]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def test_helm_renders_every_setting(tmp_path: Path) -> None:
    helm = _helm()
    if helm is None:
        pytest.skip("helm is not installed: make check-deploy installs it and runs this test")
    every = {key: _sample(key) for key in settings()}
    (tmp_path / "values.yaml").write_text(yaml.safe_dump({"settings": every}), encoding="utf-8")
    rendered = subprocess.run(
        [helm, "template", "t", str(CHART), "-f", str(tmp_path / "values.yaml")],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert sorted({env_name(k) for k in every} - set(env)) == []
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["MOCKER_FAILURE_TYPES"]["value"] == "429,abort"
    assert env["MOCKER_SERVED_MODEL_NAME"]["value"] == "a,b"
    assert env["MOCKER_MAX_NUM_SEQS"]["value"] == "2"
    assert "secretKeyRef" in env["MOCKER_ADMIN_TOKEN"]["valueFrom"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # Two replicas (replica 1 on 8001) of two data-parallel ranks each: four KV-event sockets.
    assert ports == {"http": 8000, "http-1": 8001, "kv-events": 5557, "kv-events-1": 5558,
                     "kv-events-2": 5559, "kv-events-3": 5560}  # fmt: skip
    assert any(d["kind"] == "Secret" for d in docs)


def test_helm_renders_a_pd_rig_with_lora() -> None:
    """ci/pd-values.yaml: a prefill and a decode Deployment (1 and 2 replicas), each behind
    its own Service, with vLLM's NixlConnector roles, the side channel on the pod address,
    and the LoRA settings on both."""
    helm = _helm()
    if helm is None:
        pytest.skip("helm is not installed: make check-deploy installs it and runs this test")
    rendered = subprocess.run(
        [helm, "template", "m", str(CHART), "-f", str(CHART / "ci/pd-values.yaml")],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert set(deployments) == {"m-mocker-prefill", "m-mocker-decode"}
    assert set(services) == set(deployments)
    for role, replicas, kv_role in (("prefill", 1, "kv_producer"), ("decode", 2, "kv_consumer")):
        deployment = deployments[f"m-mocker-{role}"]
        spec = deployment["spec"]
        assert spec["replicas"] == replicas
        component = {"app.kubernetes.io/component": role}
        assert component.items() <= spec["selector"]["matchLabels"].items()
        assert component.items() <= spec["template"]["metadata"]["labels"].items()
        assert component.items() <= services[f"m-mocker-{role}"]["spec"]["selector"].items()
        container = spec["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        transfer = json.loads(env["MOCKER_KV_TRANSFER_CONFIG"])
        assert (transfer["kv_connector"], transfer["kv_role"]) == ("NixlConnector", kv_role)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "$(POD_IP)"
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
        assert env["MOCKER_ENABLE_LORA"] == "true" and env["MOCKER_MAX_LORAS"] == "2"
        modules = "sql-lora=/adapters/sql-lora,chat-lora=/adapters/chat-lora"
        assert env["MOCKER_LORA_MODULES"] == modules
        assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "true"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ("nixl" in ports) == (role == "prefill")
    decode_env = deployments["m-mocker-decode"]["spec"]["template"]["spec"]["containers"][0]["env"]
    transfer = json.loads(next(e["value"] for e in decode_env
                               if e["name"] == "MOCKER_KV_TRANSFER_CONFIG"))  # fmt: skip
    assert transfer["kv_connector_extra_config"]["pull_gbps"] == 12.5
