"""A client rendering chat with the exported tokenizer folder counts the server's prompt ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from mocker.api.app import create_app
from mocker.config import EngineConfig
from mocker.settings import ServerSettings
from mocker.tokenizer import export_tokenizer, load_tokenizer
from tests.support.servers import FAST, AppClient, make_app

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is a KV cache?"},
    ],
    [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Count to three.\n1, 2, 3"},
    ],
    [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "First part,"},
                {"type": "text", "text": " second part."},
            ],
        },
    ],
    [{"role": "user", "content": "  leading and trailing spaces  "}],
]


def client_ids(folder: Path, messages: list[dict[str, Any]]) -> list[int]:
    """What a client does with `--tokenizer folder`, as Hugging Face's apply_chat_template."""
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    text = env.from_string(config["chat_template"]).render(
        messages=messages,
        add_generation_prompt=True,
        bos_token=config["bos_token"]["content"],
        eos_token=config["eos_token"]["content"],
    )
    tk = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return tk.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_tokenizer(tmp_path_factory.mktemp("tok") / "mocker-tokenizer")


async def _server_ids(c: AppClient, messages: list[dict[str, Any]]) -> list[int]:
    r = await c.http.post("/tokenize", json={"messages": messages})
    assert r.status_code == 200, r.text
    ids: list[int] = r.json()["tokens"]
    r = await c.http.post(
        "/v1/chat/completions", json={"messages": messages, "max_completion_tokens": 2}
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    return ids


@pytest.mark.parametrize("messages", CONVERSATIONS)
async def test_client_rendering_equals_the_default_server(
    folder: Path, client: AppClient, messages: list[dict[str, Any]]
) -> None:
    ids = client_ids(folder, messages)
    assert ids and ids == await _server_ids(client, messages)


async def test_a_server_on_the_exported_folder_counts_the_same(folder: Path) -> None:
    app = create_app(ServerSettings(), EngineConfig.of(**FAST), load_tokenizer(folder))
    async with AppClient(app) as exported, AppClient(make_app()) as default:
        for messages in CONVERSATIONS:
            ids = await _server_ids(exported, messages)
            assert ids == await _server_ids(default, messages) == client_ids(folder, messages)
