"""Stop strings: held-back prefixes, earliest match, include/exclude, pieces split anywhere."""

from __future__ import annotations

import random

import pytest

from mocker.api.stop_strings import StopMatcher


def _run(matcher: StopMatcher, pieces: list[str]) -> tuple[str, str | None]:
    out, matched = "", None
    for i, piece in enumerate(pieces):
        text, matched = matcher.feed(piece, final=i == len(pieces) - 1)
        out += text
        if matched is not None:
            break
    return out, matched


def test_the_last_characters_are_held_back_until_decided() -> None:
    m = StopMatcher(("END",))  # a match can start in the last len("END") - 1 characters
    assert m.feed("hello E") == ("hello", None)
    assert m.feed("x") == (" ", None)
    assert m.feed(" EN") == ("Ex ", None)
    assert m.feed("D more") == ("", "END")  # " EN" + "D": nothing of the match went out
    assert m.text == "hello Ex "


def test_include_stop_keeps_the_stop_string() -> None:
    m = StopMatcher(("END",), include_stop=True)
    assert _run(m, ["a ", "EN", "D b"]) == ("a END", "END")


def test_the_earliest_match_wins_over_the_order_given() -> None:
    m = StopMatcher(("world", "lo w"))
    assert _run(m, ["hello", " world"]) == ("hel", "lo w")


def test_a_final_piece_releases_what_was_held() -> None:
    m = StopMatcher(("xyz",))
    assert m.feed("abcx") == ("ab", None)
    assert m.feed("y", final=True) == ("cxy", None)


@pytest.mark.parametrize("seed", range(20))
def test_any_split_gives_what_one_piece_gives(seed: int) -> None:
    rng = random.Random(seed)
    text = "".join(rng.choice("ab ") for _ in range(40))
    stops = ("ab a", "bb")
    whole = _run(StopMatcher(stops), [text])
    cuts = sorted(rng.sample(range(1, len(text)), 6))
    pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert _run(StopMatcher(stops), pieces) == whole


def test_empty_stop_strings_are_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StopMatcher(("",))
