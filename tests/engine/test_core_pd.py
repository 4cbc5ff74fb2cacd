"""EngineCore as a P/D pair (NixlConnector roles): hold, pull, resume, release, fallbacks."""

from __future__ import annotations

import dataclasses
import random

import pytest

from mocker.config_choices import KVRole
from mocker.disagg.local_peers import LocalPeers
from mocker.disagg.params import parse_transfer_params
from mocker.engine.core import EngineCore
from mocker.kv.block import block_ids
from mocker.kv.events import BlockStored
from mocker.request import EngineRequest, RequestStatus, SamplingParams
from mocker.timing import PolynomialTiming
from tests.support.checks import not_none
from tests.support.engines import small_config

BS = 16
PROMPT = list(range(1000, 1100))  # 100 tokens: 7 blocks of 16 (the last one partial)


def _pair(**overrides: object) -> tuple[EngineCore, EngineCore]:
    base = {
        "block_size": BS,
        "num_gpu_blocks": 64,
        "max_num_batched_tokens": 256,
        "max_model_len": 512,
        "pull_gbps": 1.0,
        "pull_latency_ms": 0.5,
    } | overrides
    prefill = EngineCore(small_config(**base, kv_role=KVRole.PRODUCER, kv_engine_id="P"))
    decode = EngineCore(small_config(**base, kv_role=KVRole.CONSUMER, kv_engine_id="D"),
                        peers=LocalPeers({"P": prefill}))  # fmt: skip
    return prefill, decode


def _prefill_request(rid: str = "p1") -> EngineRequest:
    return EngineRequest(rid, PROMPT, SamplingParams(max_tokens=1), remote_decode=True)


def _decode_request(params: dict[str, object], rid: str = "d1", max_tokens: int = 3
                    ) -> EngineRequest:  # fmt: skip
    _, remote = parse_transfer_params(params)
    return EngineRequest(rid, PROMPT, SamplingParams(max_tokens=max_tokens),
                         remote_prefill=remote)  # fmt: skip


def _prefill(prefill: EngineCore, rid: str = "p1") -> tuple[float, dict[str, object]]:
    prefill.add_request(_prefill_request(rid))
    result = prefill.step(0.0)
    (out,) = result.outputs
    assert out.finished and out.kv_transfer_params is not None
    return result.end, out.kv_transfer_params


def test_pd_pair_hand_computed_timings() -> None:
    prefill, decode = _pair()
    timing = PolynomialTiming()
    end, params = _prefill(prefill)
    # The prefill pass: 100 new tokens.
    assert end == pytest.approx(timing.prefill_ms(100) / 1000)
    assert prefill.holds is not None
    hold_id = params["remote_request_id"]
    assert isinstance(hold_id, str) and hold_id.startswith("p1-")  # unique per hold
    held = prefill.holds.request(hold_id)
    assert held is not None
    assert params["remote_block_ids"] == [block_ids(held.blocks)]
    assert len(params["remote_block_ids"][0]) == 7
    assert params["remote_engine_id"] == "P"
    assert params["do_remote_prefill"] is True and params["transfer_mode"] == "pull"
    assert prefill.pool.num_used == 7  # held, not freed

    decode.add_request(_decode_request(params))
    idle = decode.step(end)
    assert idle.idle
    (request,) = decode.requests.values()
    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    # The pull: 7 blocks of 16 tokens at the model's KV bytes per token, over 1 GB/s, then
    # 0.5 ms of latency.
    nbytes = 7 * BS * decode.config.model.kv_bytes_per_token
    pulled_at = end + nbytes / 1e9 + 0.0005
    assert decode.next_transfer_deadline() == pytest.approx(pulled_at)
    first = decode.step(not_none(decode.next_transfer_deadline()))
    (record,) = first.pulls
    assert record.ok and record.nbytes == nbytes
    assert record.duration == pytest.approx(nbytes / 1e9 + 0.0005)
    # The first decode pass recomputes the prompt's last token (vLLM's rule) to sample.
    (out,) = first.outputs
    assert first.stats.num_scheduled_tokens == 1
    assert out.time == pytest.approx(pulled_at + timing.prefill_ms(1) / 1000)
    # Every prompt token counts as cached, those pulled as external (vLLM's prefill stats).
    assert out.num_cached_tokens == 100 and out.tier_hits == (("p2p", 100),)
    # The prefill engine learned the pull finished: its hold is gone, its blocks freed.
    assert not prefill.holds and prefill.pool.num_used == 0
    assert not prefill.has_pending_transfers()


def test_push_mode_pairs_transfer_as_pull_mode_ones_do() -> None:
    # vLLM 0.34's NixlPushConnector on both sides: its answer has no expiry time nor
    # registration generation, says "push", and the KV arrives over the same link.
    prefill, decode = _pair(kv_transfer_mode="push")
    end, params = _prefill(prefill)
    assert params["transfer_mode"] == "push" and params["remote_num_tokens"] == 100
    assert "remote_blocks_expiry_time" not in params
    assert "remote_registration_generation" not in params
    decode.add_request(_decode_request(params))
    decode.step(end)
    nbytes = 7 * BS * decode.config.model.kv_bytes_per_token
    assert decode.next_transfer_deadline() == pytest.approx(end + nbytes / 1e9 + 0.0005)
    first = decode.step(not_none(decode.next_transfer_deadline()))
    (record,) = first.pulls
    assert record.ok and first.outputs[0].num_cached_tokens == 100
    assert not prefill.holds


def test_a_push_prefill_and_a_pull_decode_never_transfer() -> None:
    # Push (WRITE) and pull (READ) connectors never complete vLLM's handshake (the mode is
    # in its compatibility hash): the transfer fails at once, the decode engine recomputes
    # (kv_load_failure_policy "recompute"), and no word reaches the prefill engine, which
    # holds the KV until its lease ends (then counted expired).
    prefill, _ = _pair(kv_transfer_mode="push", hold_timeout=1.0)
    decode = EngineCore(_pair()[1].config, peers=LocalPeers({"P": prefill}))  # pull mode
    end, params = _prefill(prefill)
    decode.add_request(_decode_request(params))
    decode.step(end)
    assert decode.next_transfer_deadline() == end  # due at once
    result = decode.step(end)
    (record,) = result.pulls
    assert not record.ok and not_none(decode.pulls).num_failed == 1
    assert result.stats.num_scheduled_tokens == 100  # the whole prompt, computed locally
    assert prefill.holds and prefill.pool.num_used == 7
    prefill.advance_transfers(end + 1.0)
    assert not prefill.holds and prefill.pool.num_used == 0
    assert prefill.holds is not None and prefill.holds.num_expired == 1


def test_a_local_prefix_hit_is_not_pulled_again() -> None:
    prefill, decode = _pair()
    end, params = _prefill(prefill)
    decode.add_request(EngineRequest("warm", PROMPT[:64] + [7] * 10, SamplingParams(max_tokens=1)))
    while decode.has_unfinished_requests():
        end = decode.step(end).end
    decode.add_request(_decode_request(params))
    decode.step(end)
    (pull,) = not_none(decode.pulls)._pulls.values()
    assert pull.num_blocks == 3  # blocks 4..6: the first four are cached on the decode side
    deadline = decode.next_transfer_deadline()
    assert deadline is not None
    out = decode.step(deadline).outputs[0]
    assert out.num_cached_tokens == 100 and out.tier_hits == (("p2p", 36),)


def test_hold_expires_and_a_late_pull_recomputes() -> None:
    prefill, decode = _pair(hold_timeout=1.0)
    end, params = _prefill(prefill)
    assert prefill.next_transfer_deadline() == pytest.approx(end + 1.0)
    prefill.advance_transfers(end + 1.0)
    assert not prefill.holds and prefill.pool.num_used == 0
    decode.add_request(_decode_request(params))
    decode.step(end + 2.0)
    result = decode.step(not_none(decode.next_transfer_deadline()))
    (record,) = result.pulls
    assert not record.ok and not_none(decode.pulls).num_failed == 1
    # It recomputes its whole prompt locally: nothing counts as pulled.
    assert result.stats.num_scheduled_tokens == 100
    (out,) = result.outputs
    assert out.num_cached_tokens == 0 and out.tier_hits == ()


def test_abort_during_pull_frees_both_sides() -> None:
    prefill, decode = _pair()
    end, params = _prefill(prefill)
    decode.add_request(_decode_request(params))
    decode.step(end)
    assert decode.pool.num_used == 7
    decode.abort_request("d1", end + 1e-6)
    assert decode.pool.num_used == 0 and not decode.pulls
    assert not prefill.holds and prefill.pool.num_used == 0
    assert not decode.has_pending_transfers()


def test_abort_before_the_pull_starts_releases_the_prefill_hold() -> None:
    prefill, decode = _pair()
    _, params = _prefill(prefill)
    decode.add_request(_decode_request(params))
    decode.abort_request("d1", 0.5)
    assert not prefill.holds and prefill.pool.num_used == 0


def test_a_reused_request_id_never_strands_the_first_hold() -> None:
    prefill, decode = _pair()
    end, first = _prefill(prefill)
    end, second = _prefill(prefill)  # the same request id, while the first is held
    assert first["remote_request_id"] != second["remote_request_id"]
    assert prefill.holds is not None and len(prefill.holds) == 2
    for i, params in enumerate((first, second)):
        decode.add_request(_decode_request(params, rid=f"d{i}"))
    while decode.has_unfinished_requests():
        result = decode.step(end)
        deadline = decode.next_transfer_deadline()
        end = result.end if not result.idle else (deadline if deadline is not None else end)
    assert not prefill.holds and prefill.pool.num_used == 0


def test_an_aborted_prefill_request_is_not_held() -> None:
    prefill, _ = _pair()
    longer = dataclasses.replace(_prefill_request(), sampling=SamplingParams(max_tokens=5))
    prefill.add_request(longer)
    prefill.step(0.0)
    out = prefill.abort_request("p1", 1.0)
    assert out is not None and out.kv_transfer_params is None
    assert not prefill.holds and prefill.pool.num_used == 0


def test_pull_timeout_recomputes_and_releases() -> None:
    prefill, decode = _pair(pull_gbps=1e-6, pull_timeout=2.0)  # a pull would take hours
    end, params = _prefill(prefill)
    decode.add_request(_decode_request(params))
    decode.step(end)
    assert decode.next_transfer_deadline() == pytest.approx(end + 2.0)
    result = decode.step(end + 2.0)
    assert result.stats.num_scheduled_tokens == 100  # recomputed at once
    assert not prefill.holds and prefill.pool.num_used == 0
    assert not decode.pulls


def test_concurrent_pulls_share_the_link() -> None:
    prefill, decode = _pair(pull_latency_ms=0.0)
    end, params_a = _prefill(prefill, "a")
    prefill.add_request(EngineRequest("b", PROMPT[::-1], SamplingParams(max_tokens=1),
                                      remote_decode=True))  # fmt: skip
    (out_b,) = prefill.step(end).outputs
    params_b = out_b.kv_transfer_params
    assert params_b is not None
    t = max(end, out_b.time)
    decode.add_request(_decode_request(params_a, "da"))
    remote_b = parse_transfer_params(params_b)[1]
    decode.add_request(EngineRequest("db", PROMPT[::-1], SamplingParams(max_tokens=2),
                                     remote_prefill=remote_b))  # fmt: skip
    decode.step(t)
    one = 7 * BS * decode.config.model.kv_bytes_per_token / 1e9
    # Two equal pulls started together each get half the link: both end after twice one.
    assert decode.next_transfer_deadline() == pytest.approx(t + 2 * one)


def test_kv_both_engines_take_either_half() -> None:
    shape = {"block_size": BS, "num_gpu_blocks": 64, "max_num_batched_tokens": 256,
             "max_model_len": 512, "kv_role": KVRole.BOTH}  # fmt: skip
    a = EngineCore(small_config(**shape, kv_engine_id="A"))
    b = EngineCore(small_config(**shape, kv_engine_id="B"), peers=LocalPeers({"A": a}))
    end, params = _prefill(a)
    b.add_request(_decode_request(params))
    b.step(end)
    deadline = b.next_transfer_deadline()
    assert deadline is not None
    out = b.step(deadline).outputs[0]
    assert out.tier_hits == (("p2p", 100),)
    assert not a.holds and a.pool.num_used == 0
    # A plain request on a kv_both engine is neither held nor pulled.
    b.add_request(EngineRequest("plain", PROMPT, SamplingParams(max_tokens=1)))
    while b.has_unfinished_requests():
        b.step(deadline)
    assert not b.holds and not b.pulls


def test_pulled_blocks_are_published_as_stored_on_the_decode_side() -> None:
    prefill, decode = _pair(enable_kv_cache_events=True)
    prefill.add_request(_prefill_request())
    first = prefill.step(0.0)
    stored = [e for e in first.kv_events if isinstance(e, BlockStored)]
    end, params = first.end, first.outputs[0].kv_transfer_params
    assert params is not None
    decode.add_request(_decode_request(params))
    assert not [e for e in decode.step(end).kv_events if isinstance(e, BlockStored)]
    deadline = decode.next_transfer_deadline()
    assert deadline is not None
    events = decode.step(deadline).kv_events
    pulled = [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]
    # The six full blocks of the prompt, under the hashes the prefill engine published.
    assert pulled == [h for e in stored for h in e.block_hashes][:6]


def test_conservation_under_random_pulls_aborts_and_expiry() -> None:
    """Whatever happens — pulls that land, aborts on either side, holds that expire, pulls
    that time out — every block held for a pull is freed, and nothing stays held."""
    rng = random.Random(7)
    seen = {"landed": 0, "failed": 0, "aborted": 0, "expired": 0}
    for trial in range(20):
        prefill, decode = _pair(hold_timeout=rng.choice([0.05, 5.0]),
                                pull_gbps=rng.choice([0.01, 1.0]),
                                pull_timeout=rng.choice([0.05, 5.0]))  # fmt: skip
        now = 0.0
        pending: list[dict[str, object]] = []
        for i in range(6):
            prompt = [rng.randrange(1, 5000) for _ in range(rng.randrange(20, 120))]
            prefill.add_request(EngineRequest(f"p{i}", prompt, SamplingParams(max_tokens=1),
                                              remote_decode=True))  # fmt: skip
            for out in prefill.step(now).outputs:
                if out.kv_transfer_params is not None:
                    pending.append(out.kv_transfer_params)
            now += 0.02
        decoded = []
        for j, params in enumerate(pending):
            request = not_none(prefill.holds).request(str(params["remote_request_id"]))
            prompt = (
                list(request.all_token_ids[: request.num_prompt_tokens]) if request else [1] * 30
            )
            _, remote = parse_transfer_params(params)
            decode.add_request(EngineRequest(f"d{j}", prompt, SamplingParams(max_tokens=2),
                                             remote_prefill=remote))  # fmt: skip
            decoded.append(f"d{j}")
        while decode.has_unfinished_requests() or decode.has_pending_transfers():
            if decoded and rng.random() < 0.2:
                decode.abort_request(decoded.pop(rng.randrange(len(decoded))), now)
                seen["aborted"] += 1
            result = decode.step(now)
            for record in result.pulls:
                seen["landed" if record.ok else "failed"] += 1
            deadline = decode.next_transfer_deadline()
            now = result.end if not result.idle else (deadline if deadline is not None else now)
            prefill.advance_transfers(now)
        prefill.advance_transfers(now + 10.0)  # what no pull claimed expires
        seen["expired"] += not_none(prefill.holds).num_expired
        assert decode.pool.num_used == 0 and not decode.pulls, trial
        assert prefill.pool.num_used == 0 and not prefill.holds, trial
    assert all(seen.values()), seen  # every path was taken
