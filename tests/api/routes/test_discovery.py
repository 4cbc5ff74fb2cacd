"""Discovery routes: server and model info, load and cache flush, in the routers' shapes."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import httpx

from mocker import __version__
from tests.support.servers import AppClient, ServerThread, make_app, settings


async def test_server_info_has_vllms_config_and_what_both_routers_read() -> None:
    app = make_app(
        settings(model="org/model-7b", served_model_names=("m7",), data_parallel_size=2),
        block_size=32,
        num_gpu_blocks=1000,
        prefix_caching_hash_algo="sha256_cbor",
    )
    async with AppClient(app) as c:
        body = (await c.http.get("/server_info", params={"config_format": "json"})).json()
        text = (await c.http.get("/server_info")).json()
        sglang_spelling = (await c.http.get("/get_server_info")).json()
    vllm = body["vllm_config"]  # what vllm-router's P/D discovery reads
    assert vllm["model_config"]["model"] == "org/model-7b"
    assert vllm["model_config"]["served_model_name"] == ["m7"]
    assert vllm["cache_config"]["block_size"] == 32
    assert vllm["cache_config"]["num_gpu_blocks"] == 1000
    assert vllm["cache_config"]["prefix_caching_hash_algo"] == "sha256_cbor"
    assert vllm["parallel_config"]["data_parallel_size"] == 2
    assert vllm["kv_events_config"]["enable_kv_cache_events"] is False
    assert vllm["kv_transfer_config"] is None
    assert isinstance(text["vllm_config"], str) and "org/model-7b" in text["vllm_config"]
    # sglang-router's registration fields, and vllm-router's kv_aware ones
    assert (body["model_path"], body["served_model_name"]) == ("org/model-7b", "m7")
    assert (body["tp_size"], body["dp_size"]) == (1, 2)
    assert body["max_total_num_tokens"] == 32_000 and body["version"] == __version__
    assert (body["model_id"], body["kv_block_size"]) == ("m7", 32)
    assert body["instance_id"] == vllm["instance_id"] != ""
    assert sglang_spelling == text


async def test_server_info_names_the_pd_role() -> None:
    # A decode engine: it binds no side channel (a prefill engine would bind port 5600).
    app = make_app(kv_role="kv_consumer", kv_engine_id="d-0", num_cpu_blocks=64)
    async with AppClient(app) as c:
        body = (await c.http.get("/server_info", params={"config_format": "json"})).json()
    transfer = body["vllm_config"]["kv_transfer_config"]
    # The P/D connector and the CPU tier's together, as vLLM's MultiConnector holds them.
    assert transfer["kv_connector"] == "MultiConnector"
    nixl, offload = transfer["kv_connector_extra_config"]["connectors"]
    assert (nixl["kv_connector"], nixl["kv_role"], nixl["engine_id"]) == (
        "NixlConnector", "kv_consumer", "d-0")  # fmt: skip
    assert offload["kv_connector"] == "OffloadingConnector"


async def test_model_info_in_sglangs_shape(client: AppClient) -> None:
    body = (await client.http.get("/model_info")).json()
    assert body == (await client.http.get("/get_model_info")).json()
    assert body["is_generation"] is True
    assert (body["model_type"], body["architectures"]) == ("llama", ["LlamaForCausalLM"])


async def test_get_load_counts_what_the_engine_holds() -> None:
    # A real server and a slow engine: the streams are still running when the load is read.
    app = make_app(speedup_ratio=1.0, block_size=16)
    with ServerThread(app) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
            idle = (await http.get("/get_load")).json()
            assert idle == {"load": 0}  # vllm-router's shape, the default
            async with contextlib.AsyncExitStack() as stack:
                lines = []  # held: a dropped line iterator closes its stream (an abort)
                for i in range(3):
                    body = {"prompt": [i, *range(100, 163)], "max_tokens": 2000, "stream": True}
                    r = await stack.enter_async_context(
                        http.stream("POST", "/v1/completions", json=body)
                    )
                    assert r.status_code == 200
                    lines.append(r.aiter_lines())
                    await anext(lines[-1])  # its first token: it is running
                assert (await http.get("/get_load")).json() == {"load": 3}
                state = app.state.mocker
                state.settings = replace(state.settings, get_load_format="sglang")
                (load,) = (await http.get("/get_load")).json()
                assert (load["dp_rank"], load["num_reqs"], load["num_waiting_reqs"]) == (0, 3, 0)
                assert load["num_tokens"] >= 3 * 64  # their prompts' KV, at least
                assert set(load) == {"rid", "http_worker_ipc", "dp_rank", "num_reqs",
                                     "num_waiting_reqs", "num_tokens", "ts_tic"}  # fmt: skip


async def test_flush_cache_drops_the_prefix_cache_as_sglang_answers(client: AppClient) -> None:
    prompt = {"prompt": list(range(500, 564)), "max_tokens": 1}
    await client.http.post("/v1/completions", json=prompt)
    hit = (await client.http.post("/v1/completions", json=prompt)).json()
    assert hit["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    r = await client.http.post("/flush_cache")
    assert r.status_code == 200 and r.text.startswith("Cache flushed.")
    assert r.headers["content-type"].startswith("text/plain")
    cold = (await client.http.post("/v1/completions", json=prompt)).json()
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert (await client.http.get("/flush_cache")).status_code == 200
