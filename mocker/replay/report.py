"""Replay outputs: requests.jsonl, summary.json, a printed table and PNG plots."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mocker.replay.records import ReplayResult

__all__ = ["summarize", "table", "write_outputs"]


def _quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    ordered = sorted(values)
    n = len(ordered)

    def q(p: float) -> float:
        return ordered[min(n - 1, int(p * n))]  # nearest rank

    return {
        "mean": round(sum(ordered) / n, 6),
        "p50": round(q(0.5), 6),
        "p90": round(q(0.9), 6),
        "p99": round(q(0.99), 6),
    }


def summarize(result: ReplayResult) -> dict[str, Any]:
    """The run in one JSON object (simulated times in seconds)."""
    done = [r for r in result.records if r.status == "finished"]
    rejected = [r for r in result.records if r.status != "finished"]
    duration = result.sim_duration
    prompt = sum(r.input_tokens for r in done)
    output = sum(r.output_tokens for r in done)
    device = sum(r.cached_tokens_device for r in done)
    config = result.cores[0].config if result.cores else None
    tiers = [] if config is None or not config.has_cpu_tier else ["cpu"]
    tiers += [t.name for t in config.offload.storage_tiers] if config is not None else []
    by_tier = dict.fromkeys(tiers, 0)
    for r in done:
        for tier, n in r.cached_tokens_by_tier.items():
            by_tier[tier] = by_tier.get(tier, 0) + n
    offload = {"store_bytes": result.store_bytes, "load_bytes": result.load_bytes,
               "link_bytes": dict(sorted(result.link_bytes.items()))}  # fmt: skip
    reasons: dict[str, int] = {}
    for r in rejected:
        reasons[r.status] = reasons.get(r.status, 0) + 1
    extra: dict[str, Any] = {}
    pd = [r for r in done if r.prefill_engine is not None]
    if pd:  # P/D: how long the decode engines waited for the KV
        extra["prefill_engines"] = len({r.prefill_engine for r in pd})
        extra["pull_s"] = _quantiles([r.pull_time for r in pd])
    if any(r.lora is not None for r in done):
        extra["lora_wait_s"] = _quantiles([r.lora_wait for r in done if r.lora is not None])
    if config is not None and config.is_hybrid:
        extra["kv_usage_by_group"] = _group_usage(result)
    return {
        "requests": len(result.records),
        "finished": len(done),
        "rejected": len(rejected),
        "rejected_reasons": reasons,
        "ttft_s": _quantiles([r.ttft for r in done if r.ttft is not None]),
        "itl_s": _quantiles([r.mean_itl for r in done if r.mean_itl is not None]),
        "e2e_s": _quantiles([r.e2e for r in done if r.e2e is not None]),
        "requests_per_s": round(len(done) / duration, 4) if duration else None,
        "output_tokens_per_s": round(output / duration, 2) if duration else None,
        "prompt_tokens": prompt,
        "output_tokens": output,
        # Per tier: the device, then each tier below it (cpu, fs, obj) that the engines have.
        "prefix_hit_rate": {
            tier: round(n / prompt, 6) if prompt else 0.0
            for tier, n in {"device": device, **by_tier}.items()
        },
        "preemptions": sum(r.preemptions for r in done),
        "offload": offload,
        "engines": len(result.cores),
        "sim_duration_s": round(duration, 6),
        "wall_s": round(result.wall_s, 3),
        "speedup_over_real_time": round(duration / result.wall_s, 2) if result.wall_s else None,
        "steps": result.num_steps,
        **extra,
    }


def _group_usage(result: ReplayResult) -> dict[str, dict[str, float]]:
    """Per KV cache group ("INDEX:KIND"), its share of the device pool over the samples of
    every engine: mean and peak."""
    layout = result.cores[0].config.layout
    out: dict[str, dict[str, float]] = {}
    for g in layout.groups:
        values = [s.group_usage[g.index] for s in result.samples if s.group_usage]
        out[f"{g.index}:{g.kind.value}"] = {
            "mean": round(sum(values) / len(values), 6) if values else 0.0,
            "max": round(max(values), 6) if values else 0.0,
        }
    return out


def table(summary: dict[str, Any]) -> str:
    """A plain-text table of the summary (what `mocker replay` prints)."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.1f}"

    lines = [
        f"{'metric':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}   (ms)",
    ]
    for name, key in (("TTFT", "ttft_s"), ("ITL", "itl_s"), ("E2E", "e2e_s")):
        q = summary[key]
        lines.append(
            f"{name:<10}{ms(q['mean']):>10}{ms(q['p50']):>10}{ms(q['p90']):>10}{ms(q['p99']):>10}"
        )
    hits = summary["prefix_hit_rate"]
    lines += [
        f"requests {summary['requests']} (finished {summary['finished']}, rejected "
        f"{summary['rejected']}) on {summary['engines']} engine(s)",
        f"throughput {summary['requests_per_s']} req/s, {summary['output_tokens_per_s']} "
        "output tokens/s",
        "prefix hits: "
        + ", ".join(f"{tier} {rate:.1%}" for tier, rate in hits.items())
        + f"; preemptions "
        f"{summary['preemptions']}; offload stored {summary['offload']['store_bytes']} B, "
        f"loaded {summary['offload']['load_bytes']} B",
        f"simulated {summary['sim_duration_s']:.1f} s in {summary['wall_s']:.1f} s wall "
        f"({summary['speedup_over_real_time']}x real time)",
    ]
    if "kv_usage_by_group" in summary:
        lines.append(
            "KV usage by group (mean / peak): "
            + ", ".join(
                f"{g} {u['mean']:.1%} / {u['max']:.1%}"
                for g, u in summary["kv_usage_by_group"].items()
            )
        )
    for key, what in (("pull_s", "P/D KV pull"), ("lora_wait_s", "LoRA adapter load wait")):
        if key in summary:
            q = summary[key]
            lines.append(f"{what}: mean {ms(q['mean'])} ms, p50 {ms(q['p50'])} ms, "
                         f"p99 {ms(q['p99'])} ms")  # fmt: skip
    return "\n".join(lines)


def write_outputs(
    result: ReplayResult, summary: dict[str, Any], out_dir: Path, *, plots: bool = True
) -> list[Path]:
    """requests.jsonl (one row per request, in trace order), summary.json and the plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = out_dir / "requests.jsonl"
    with rows.open("w", encoding="utf-8") as f:
        for record in result.records:
            f.write(json.dumps(asdict(record), separators=(",", ":")) + "\n")
    summary_path = out_dir / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return [rows, summary_path, *(_plots(result, out_dir) if plots else [])]


def _plots(result: ReplayResult, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    paths: list[Path] = []
    ttfts = sorted(r.ttft for r in result.records if r.ttft is not None)
    fig, ax = plt.subplots(figsize=(6, 4))
    if ttfts:
        n = len(ttfts)
        ax.plot([t * 1000 for t in ttfts], [(i + 1) / n for i in range(n)])
        ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms, simulated)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF")
    ax.grid(True, alpha=0.3)
    path = out_dir / "ttft_cdf.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    paths.append(path)

    fig, (kv, queue) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for engine in range(len(result.cores)):
        samples = [s for s in result.samples if s.engine == engine]
        times = [s.time for s in samples]
        kv.plot(times, [s.kv_usage for s in samples], label=f"engine {engine}")
        if samples and samples[0].group_usage:  # a hybrid model: each group's share too
            for g in range(len(samples[0].group_usage)):
                kv.plot(times, [s.group_usage[g] for s in samples], linestyle=":",
                        label=f"engine {engine} group {g}")  # fmt: skip
        queue.plot(times, [s.waiting for s in samples], label=f"engine {engine}")
    kv.set_ylabel("KV usage")
    queue.set_ylabel("waiting requests")
    queue.set_xlabel("simulated time (s)")
    kv.legend(loc="upper right", fontsize="small")
    kv.grid(True, alpha=0.3)
    queue.grid(True, alpha=0.3)
    path = out_dir / "engines.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    paths.append(path)
    return paths
