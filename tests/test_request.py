"""Request state: status order, incremental hashes as output tokens arrive."""

from mocker.kv.hashing import BlockHasher, extra_keys_bytes
from mocker.request import FinishReason, Request, RequestId, RequestStatus, SamplingParams


def test_status_order_makes_finished_a_comparison() -> None:
    assert not RequestStatus.PREEMPTED.is_finished
    assert all(
        s.is_finished
        for s in (
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH_CAPPED,
            RequestStatus.FINISHED_ABORTED,
        )
    )


def test_hashes_extend_as_generated_tokens_fill_blocks() -> None:
    h = BlockHasher(0)
    r = Request(RequestId("a"), [1, 2, 3, 4, 5, 6], 6, 10, SamplingParams(), 0.0)
    r.enable_hashing(h, 4, None)
    assert len(r.block_hashes) == 1
    r.append_output_token(7)
    assert len(r.block_hashes) == 1
    r.append_output_token(8)  # tokens 5..8 complete block 1
    assert r.block_hashes[1] == h.hash_block(r.block_hashes[0], [5, 6, 7, 8])
    assert r.output_token_ids == [7, 8] and r.num_output_tokens == 2


def test_lora_in_every_block_and_salt_in_the_first() -> None:
    h = BlockHasher(0)
    r = Request(RequestId("a"), list(range(8)), 8, 1, SamplingParams(), 0.0, lora_name="L")
    r.enable_hashing(h, 4, "salt")
    lora = extra_keys_bytes("L")
    first = h.hash_block(None, [0, 1, 2, 3], extra_keys_bytes("L", "salt"))
    assert r.block_hashes == [first, h.hash_block(first, [4, 5, 6, 7], lora)]


def test_finish_reason_of_status() -> None:
    r = Request(RequestId("a"), [1], 1, 1, SamplingParams(), 0.0)
    assert r.finish_reason is None
    r.status = RequestStatus.FINISHED_LENGTH_CAPPED
    assert r.finish_reason is FinishReason.LENGTH


def test_salt_and_lora_never_share_a_key() -> None:
    h = BlockHasher(0)
    salted = Request(RequestId("s"), list(range(4)), 4, 1, SamplingParams(), 0.0)
    salted.enable_hashing(h, 4, "X")
    lora = Request(RequestId("l"), list(range(4)), 4, 1, SamplingParams(), 0.0, lora_name="X")
    lora.enable_hashing(h, 4, None)
    assert salted.block_hashes[0] != lora.block_hashes[0]
