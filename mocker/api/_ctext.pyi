from typing import Any

class TextTable:
    def __init__(self, pieces: dict[int, bytes]) -> None: ...
    def framed(self, token_id: int, head: bytes, tail: bytes, /) -> bytes | None: ...
    def text(self, token_id: int, /) -> bytes | None: ...
    def __len__(self) -> int: ...

class Sink:
    def __init__(
        self,
        table: TextTable,
        head: bytes,
        tail: bytes,
        emitter: Any,
        direct: Any,
        cycle: Any,
        choice: Any,
    ) -> None: ...
    def __call__(self, token_id: int, /) -> bool: ...
