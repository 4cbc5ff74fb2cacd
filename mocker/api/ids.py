"""Random ids in `uuid.uuid4().hex`'s form (vLLM's random_uuid), without a system call each."""

from __future__ import annotations

import random

__all__ = ["random_hex"]

# uuid4's fixed bits: version 4 in bits 76-79, variant 0b10 in bits 62-63.
_CLEAR = ~((0xF << 76) | (0x3 << 62))
_SET = (0x4 << 76) | (0x2 << 62)


def random_hex() -> str:
    """32 hex digits with uuid4's version and variant bits, from the `random` module's
    generator (seeded from the OS, and again in a forked child) instead of `os.urandom`:
    0.3 us instead of 1.6 per request. Ids need to be unique, not secret."""
    return "%032x" % (random.getrandbits(128) & _CLEAR | _SET)
