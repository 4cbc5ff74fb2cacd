"""LoRA adapters served as models: --lora-modules, runtime load and unload, /v1/models,
requests that name an adapter, and vLLM's LoRA gauge."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mocker.config import ConfigError
from mocker.settings import ServerSettings
from mocker.settings.lora import LoraModule, parse_lora_modules
from tests.support.servers import AppClient, ServerThread, make_app, settings

SQL = LoraModule("sql-lora", "/adapters/sql", "base")


def _app(**engine: object) -> AppClient:
    served = settings(model="base", served_model_names=("base",), lora_modules=(SQL,))
    return AppClient(make_app(served, enable_lora=True, **engine))


def test_lora_modules_take_vllms_two_spellings() -> None:
    got = parse_lora_modules(["a=/p/a", '{"name": "b", "path": "/p/b", "base_model_name": "m"}'])
    assert got == (LoraModule("a", "/p/a"), LoraModule("b", "/p/b", "m"))
    with pytest.raises(ConfigError, match="Invalid JSON format for --lora-modules"):
        parse_lora_modules(["{not json"])
    with pytest.raises(ConfigError, match="Invalid fields for --lora-modules"):
        parse_lora_modules(['{"name": "x"}'])
    with pytest.raises(ConfigError, match="given twice"):
        parse_lora_modules(["a=/1", "a=/2"])


def test_lora_modules_need_enable_lora() -> None:
    with pytest.raises(ConfigError, match="needs --enable-lora"):
        make_app(ServerSettings(lora_modules=(SQL,)))


async def test_models_list_adapters_after_the_base_model() -> None:
    async with _app() as c:
        data = (await c.http.get("/v1/models")).json()["data"]
    assert [m["id"] for m in data] == ["base", "sql-lora"]
    adapter = data[1]
    assert (adapter["root"], adapter["parent"], adapter["max_model_len"]) == (
        "/adapters/sql",
        "base",
        None,
    )


async def test_a_request_naming_an_adapter_runs_with_it_and_shares_no_prefix() -> None:
    prompt = list(range(300, 364))  # 4 full blocks
    async with _app() as c:
        base = await c.http.post("/v1/completions", json={"model": "base", "prompt": prompt,
                                                           "max_tokens": 1})  # fmt: skip
        assert base.json()["model"] == "base"
        first = (await c.http.post("/v1/completions", json={"model": "sql-lora",
                 "prompt": prompt, "max_tokens": 1})).json()  # fmt: skip
        assert first["model"] == "sql-lora"  # echoed, as vLLM
        # The adapter's blocks hash with it: the base model's cached prefix is not its own.
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        again = (await c.http.post("/v1/completions", json={"model": "sql-lora",
                 "prompt": prompt, "max_tokens": 1})).json()  # fmt: skip
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 48
        unknown = await c.http.post("/v1/completions", json={"model": "nope", "prompt": "x"})
        assert unknown.status_code == 404


async def test_runtime_load_and_unload_as_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    async with _app() as c:  # without VLLM_ALLOW_RUNTIME_LORA_UPDATING: no such routes
        r = await c.http.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/x"})
        assert r.status_code == 404
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    async with _app() as c:
        load = {"lora_name": "chat-lora", "lora_path": "/adapters/chat"}
        r = await c.http.post("/v1/load_lora_adapter", json=load)
        assert r.status_code == 200
        assert r.text == "Success: LoRA adapter 'chat-lora' added successfully."
        again = await c.http.post("/v1/load_lora_adapter", json=load)
        assert again.status_code == 400
        assert again.json()["error"]["type"] == "InvalidUserInput"
        assert "has already been loaded" in again.json()["error"]["message"]
        r = await c.http.post("/v1/completions", json={"model": "chat-lora", "prompt": "hi",
                                                        "max_tokens": 1})  # fmt: skip
        assert r.status_code == 200 and r.json()["model"] == "chat-lora"
        # Loaded into the CPU cache as vLLM loads it: its first use read nothing from disk.
        lora = c.state.engines[0].core.lora
        assert lora is not None and lora.loads == {"cpu": 1, "disk": 0}
        clash = await c.http.post("/v1/load_lora_adapter",
                                  json={"lora_name": "base", "lora_path": "/b"})  # fmt: skip
        assert clash.status_code == 400 and "conflicts with a served base model" in clash.text
        empty = await c.http.post("/v1/load_lora_adapter",
                                  json={"lora_name": "", "lora_path": "/b"})  # fmt: skip
        assert empty.json()["error"]["message"] == (
            "Both 'lora_name' and 'lora_path' must be provided."
        )
        for bad in ({"lora_name": "a\u0000b", "lora_path": "/b"},
                    {"lora_name": "ok", "lora_path": "/b\n"},
                    {"lora_name": "x" * 5000, "lora_path": "/b"}):  # fmt: skip
            r = await c.http.post("/v1/load_lora_adapter", json=bad)
            assert r.status_code == 400 and "printable text" in r.json()["error"]["message"]
        models = (await c.http.get("/v1/models")).json()["data"]
        assert not any("\u0000" in m["id"] or len(m["id"]) > 4096 for m in models)
        r = await c.http.post("/v1/unload_lora_adapter", json={"lora_name": "chat-lora"})
        assert r.text == "Success: LoRA adapter 'chat-lora' removed successfully."
        gone = await c.http.post("/v1/unload_lora_adapter", json={"lora_name": "chat-lora"})
        assert gone.status_code == 404
        assert gone.json()["error"]["message"] == "The lora adapter 'chat-lora' cannot be found."
        r = await c.http.post("/v1/completions", json={"model": "chat-lora", "prompt": "hi"})
        assert r.status_code == 404


async def test_lora_requests_info_gauge_is_vllms() -> None:
    async with _app(max_loras=2) as c:
        await c.http.post("/v1/completions", json={"model": "sql-lora", "prompt": "x",
                                                    "max_tokens": 1})  # fmt: skip
        text = (await c.http.get("/metrics")).text
    (family,) = [f for f in text_string_to_metric_families(text)
                 if f.name == "vllm:lora_requests_info"]  # fmt: skip
    assert family.type == "gauge"
    (sample,) = family.samples  # idle: no adapter has a request
    assert sample.labels == {"max_lora": "2", "waiting_lora_adapters": "",
                             "running_lora_adapters": ""}  # fmt: skip
    assert sample.value > 1.7e9  # the time the label set was last current


async def test_no_lora_gauge_without_enable_lora(client: AppClient) -> None:
    text = (await client.http.get("/metrics")).text
    assert "vllm:lora_requests_info" not in text


def test_openai_client_runs_an_adapter_and_the_gauge_names_it_while_it_runs() -> None:
    served = settings(model="base", served_model_names=("base",), lora_modules=(SQL,))
    app = make_app(served, enable_lora=True, speedup_ratio=1.0)
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        assert [m.id for m in client.models.list()] == ["base", "sql-lora"]
        stream = client.completions.create(
            model="sql-lora", prompt="SELECT", max_tokens=400, stream=True
        )
        first = next(iter(stream))  # running now
        assert first.model == "sql-lora"
        text = httpx.get(srv.url + "/metrics", timeout=10).text
        stream.close()
    samples = [s for f in text_string_to_metric_families(text)
               if f.name == "vllm:lora_requests_info" for s in f.samples]  # fmt: skip
    newest = max(samples, key=lambda s: s.value)
    assert newest.labels["running_lora_adapters"] == "sql-lora"
    assert newest.labels["waiting_lora_adapters"] == "sql-lora"  # vLLM 0.33 lists both alike
