"""Types of the compiled pass applier and draws (mocker/engine/_cpass.c)."""

from collections.abc import Callable
from typing import Any

def draws(
    seed: int,
    start: int,
    count: int,
    eos_from: int,
    palette: list[int],
    eos_token_id: int,
    eos_threshold: int,
) -> list[int]: ...
def rows(seeds: list[int], starts: list[int], count: int, palette_ids: Any) -> bytes: ...
def column(seeds: list[int], indexes: list[int], palette: list[int]) -> list[int]: ...

class DecodeApplier:
    def __init__(
        self,
        request_type: type,
        sampling_type: type,
        output_type: type,
        block_size: int,
        eos_token_id: int | None,
    ) -> None: ...
    def decodes(
        self,
        running: list[Any],
        start: int,
        budget: int,
        scheduled: dict[Any, int],
        allocate: Callable[[Any, int], bool],
        /,
    ) -> tuple[int, int, int]: ...
    def run(
        self,
        scheduled: dict[Any, int],
        end: float,
        emit: bool,
        column: list[int] | None,
        registered: dict[Any, int] | None,
        token: Callable[[int, int, bool], int],
        cache: Callable[[Any], None],
        outputs: list[Any],
        slow: Callable[[Any, int], int],
    ) -> int: ...

def deliver(
    streams: dict[str, Any],
    outputs: list[Any],
    hand: Callable[[dict[str, Any], Any, Any], None],
    /,
) -> list[Any] | None: ...
