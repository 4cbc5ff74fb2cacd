"""create_app: the routers it mounts (admin only with a token) and the engines' lifespan."""

from __future__ import annotations

import inspect
from typing import get_args

from fastapi import FastAPI
from fastapi.routing import APIRoute

from mocker.api import auth, dependencies
from mocker.api.routes import inference, openai
from tests.support.servers import make_app, settings

ROUTES = {
    ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
    ("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/health"), ("GET", "/ping"),
    ("POST", "/ping"), ("GET", "/version"), ("GET", "/metrics"), ("GET", "/kv_event_sources"),
    ("POST", "/reset_prefix_cache"),
}  # fmt: skip
ADMIN = {("GET", "/admin/config"), ("POST", "/admin/config")}


def _routes(app: FastAPI) -> set[tuple[str, str]]:
    """(method, path) of every route, as the OpenAPI document lists them."""
    return {(m.upper(), path) for path, ops in app.openapi()["paths"].items() for m in ops}


def test_every_router_is_mounted_and_admin_only_with_a_token() -> None:
    mounted = _routes(make_app())
    assert mounted >= ROUTES and not mounted & ADMIN
    assert _routes(make_app(settings(admin_token="t"))) >= ROUTES | ADMIN


async def test_the_lifespan_runs_the_engines_and_stops_them() -> None:
    app = make_app(settings(data_parallel_size=2))
    engines = app.state.mocker.engines
    assert not any(e.is_running for e in engines)
    async with app.router.lifespan_context(app):
        assert all(e.is_running for e in engines)
    assert not any(e.is_running for e in engines) and engines.is_dead


def test_dependencies_are_async_so_no_request_takes_a_thread_hop() -> None:
    # FastAPI runs a plain `def` dependency in a worker thread: a hop per request, and
    # worker threads contending for the GIL with the engine loop.
    used = [dependencies.get_state, auth.require_api_key, auth.require_admin_token]
    _, depends = get_args(dependencies.State)  # Annotated[ServerState, Depends(...)]
    assert depends.dependency in used
    for fn in used:
        assert inspect.iscoroutinefunction(fn), fn.__qualname__


GENERATION = {"/v1/completions", "/v1/chat/completions", "/v1/completions/render",
              "/v1/chat/completions/render", "/inference/v1/generate"}  # fmt: skip
SESSION_ROUTES = {"/v1/completions", "/v1/chat/completions", "/v1/responses",
                  "/inference/v1/generate"}  # fmt: skip


def test_generation_routes_solve_no_header_parameters_yet_document_them() -> None:
    # Three Header() parameters, solved and validated one by one, cost about a tenth of a
    # generation request's handling; the routes read them from the request instead.
    app = make_app()
    mounted = [*openai.router.routes, *inference.router.routes]
    routes = [r for r in mounted if isinstance(r, APIRoute) and r.path in GENERATION]
    assert {r.path for r in routes} == GENERATION
    for route in routes:
        assert not route.dependant.dependencies and not route.dependant.header_params
    paths = app.openapi()["paths"]
    for path in GENERATION:
        names = [p["name"] for p in paths[path]["post"]["parameters"]]
        # (X-Mocker-Fail is a test hook, described in words but not offered as a parameter.)
        # (vLLM 0.34's X-Session-ID on the routes that read a session.)
        sessions = ["x-session-id"] if path in SESSION_ROUTES else []
        assert names == ["x-request-id", "x-data-parallel-rank", *sessions], path
