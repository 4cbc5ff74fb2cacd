from collections.abc import Sequence

def chain(
    parent: int,
    token_ids: Sequence[int],
    start: int,
    end: int,
    block_size: int,
    seed: int,
    extra: bytes,
    first: bytes,
) -> bytes | None: ...
def xxh3_64(data: bytes, seed: int) -> int: ...
