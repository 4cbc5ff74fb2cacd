"""Fixtures for the HTTP layer: an in-process client and a real server per module."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support.servers import AppClient, ServerThread, make_app


@pytest.fixture
async def client() -> AsyncIterator[AppClient]:
    async with AppClient(make_app()) as c:
        yield c


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread(make_app()) as srv:
        yield srv
