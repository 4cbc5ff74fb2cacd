"""Operations routes: health, ping, version, OpenAPI; health once an engine is dead."""

from __future__ import annotations

from mocker import __version__
from tests.support.servers import AppClient


async def test_health_ping_version_openapi(client: AppClient) -> None:
    r = await client.http.get("/health")
    assert r.status_code == 200 and r.content == b""
    assert (await client.http.get("/ping")).status_code == 200
    assert (await client.http.post("/ping")).status_code == 200
    assert (await client.http.get("/version")).json() == {"version": __version__}
    paths = (await client.http.get("/openapi.json")).json()["paths"]
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize"):
        assert path in paths


async def test_health_is_503_once_the_engine_is_dead(client: AppClient) -> None:
    await client.state.engines.stop()
    assert (await client.http.get("/health")).status_code == 503
    r = await client.http.post("/v1/completions", json={"prompt": "hi"})
    assert r.status_code == 503 and r.json()["error"]["code"] == 503
