"""ids.random_hex: uuid4's hex form, unique."""

from __future__ import annotations

import uuid

from mocker.api.ids import random_hex


def test_ids_read_as_uuid4s_and_do_not_repeat() -> None:
    ids = [random_hex() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    for text in ids[:500]:
        assert len(text) == 32 and text == text.lower()
        parsed = uuid.UUID(hex=text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and parsed.hex == text
    # Every digit but the fixed ones varies.
    for position in range(32):
        digits = {text[position] for text in ids[:2000]}
        assert len(digits) == (1 if position == 12 else 4 if position == 16 else 16), position
