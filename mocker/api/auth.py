"""Bearer-token checks: the API key on /v1/*, the admin token on /admin/*."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Header

from mocker.api.dependencies import State
from mocker.api.errors import OpenAIError

__all__ = ["check_bearer", "require_admin_token", "require_api_key"]

Authorization = Annotated[str | None, Header()]


def check_bearer(authorization: str | None, token: str | None, what: str) -> None:
    if token is None:
        return  # not configured: open
    expected = f"Bearer {token}".encode()
    if authorization is None or not secrets.compare_digest(authorization.encode(), expected):
        raise OpenAIError(401, f"Unauthorized: a valid {what} is required (Bearer token).")


async def require_api_key(state: State, authorization: Authorization = None) -> None:
    """--api-key: 'Authorization: Bearer KEY' on every /v1 route."""
    check_bearer(authorization, state.settings.api_key, "API key")


async def require_admin_token(state: State, authorization: Authorization = None) -> None:
    """--admin-token: 'Authorization: Bearer TOKEN' on /admin routes."""
    check_bearer(authorization, state.settings.admin_token, "admin token")
