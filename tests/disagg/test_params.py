"""kv_transfer_params: parsing what a router sends, and the prefill side's answer."""

from __future__ import annotations

from typing import Any

import pytest

from mocker.disagg.params import InvalidTransferParams, RemotePrefill, parse_transfer_params

ROUTER = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
          "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip
ANSWER = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[3, 4, 5]],
          "remote_engine_id": "e1", "remote_request_id": "r1", "remote_host": "10.0.0.1",
          "remote_port": 5600, "tp_size": 1, "remote_prefill_cached_tokens": 32,
          "transfer_mode": "pull"}  # fmt: skip


def test_router_prefill_leg_asks_to_hold() -> None:
    assert parse_transfer_params(ROUTER) == (True, None)
    assert parse_transfer_params(None) == (False, None)
    assert parse_transfer_params({}) == (False, None)


def test_decode_leg_names_the_prefill_engine() -> None:
    assert parse_transfer_params(ANSWER) == (
        False, RemotePrefill("e1", "r1", (3, 4, 5), "10.0.0.1", 5600, 32),
    )  # fmt: skip
    flat = {**ANSWER, "remote_block_ids": [3, 4], "remote_prefill_cached_tokens": None}
    assert parse_transfer_params(flat)[1] == RemotePrefill("e1", "r1", (3, 4), "10.0.0.1", 5600)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("x", "must be an object"),
        ({"do_remote_decode": 1}, "do_remote_decode must be true or false"),
        ({**ANSWER, "do_remote_decode": True}, "both true"),
        ({"do_remote_prefill": True}, "needs remote_block_ids, remote_engine_id"),
        ({**ANSWER, "remote_block_ids": []}, "non-empty list"),
        ({**ANSWER, "remote_block_ids": [[1, -2]]}, "block ids"),
        ({**ANSWER, "remote_block_ids": [[True]]}, "block ids"),
        ({**ANSWER, "remote_port": 70000}, "port number"),
        ({**ANSWER, "remote_port": "5600"}, "port number"),
        ({**ANSWER, "remote_engine_id": ""}, "non-empty string"),
        ({**ANSWER, "remote_prefill_cached_tokens": -1}, "integer >= 0"),
    ],
)
def test_unusable_params_are_refused(params: Any, message: str) -> None:
    with pytest.raises(InvalidTransferParams, match=message):
        parse_transfer_params(params)
