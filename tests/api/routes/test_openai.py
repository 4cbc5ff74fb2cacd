"""The /v1 routes' own answers: model cards, served names."""

from __future__ import annotations

from tests.support.servers import AppClient, make_app, settings


async def test_models_card_carries_max_model_len(client: AppClient) -> None:
    r = await client.http.get("/v1/models")
    assert r.status_code == 200
    card = r.json()["data"][0]
    assert card["id"] == "mocker" and card["object"] == "model" and card["root"] == "mocker"
    assert card["max_model_len"] == 4096 and card["owned_by"] == "vllm"
    assert isinstance(card["created"], int)


async def test_served_model_names_each_get_a_card_and_are_accepted() -> None:
    app = make_app(settings(model="org/base", served_model_names=("a", "b")))
    async with AppClient(app) as c:
        ids = [m["id"] for m in (await c.http.get("/v1/models")).json()["data"]]
        assert ids == ["a", "b"]
        for name in ("a", "b", "org/base"):
            r = await c.http.post("/v1/completions", json={"model": name, "prompt": "x"})
            assert r.status_code == 200, r.text
        assert r.json()["model"] == "a"  # the base model answers under the first name
