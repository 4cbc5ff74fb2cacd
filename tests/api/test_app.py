"""create_app: the routers it mounts (admin only with a token) and the engines' lifespan."""

from __future__ import annotations

import inspect

from fastapi import FastAPI

from mocker.api import auth, dependencies
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
    used = [dependencies.get_state, dependencies.request_headers, auth.require_api_key,
            auth.require_admin_token]  # fmt: skip
    for name in ("State", "Headers"):
        (depends,) = getattr(dependencies, name).__metadata__
        assert depends.dependency in used
    for fn in used:
        assert inspect.iscoroutinefunction(fn), fn.__qualname__
