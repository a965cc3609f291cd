"""The dossier's headline, live: Least-Stale and score-based prefetch against a real disk.

    python benchmarks/disk_tier_headline.py [--tokens=32] [--reps=3] [--out=FILE.md]

The embedded model's experts, written in the packed layout at native precision and int4 to a
temporary directory on this machine's disk, are streamed from storage through a host tier of
30% and 60% (wall clock; `io.mode=direct`: every storage read is an O_DIRECT read, so none is
served from the page cache — a VM's host may still cache: `benchmarks/cold_read.py` measures
whether it does). Each cell generates `--tokens` greedy tokens with an eviction (`least_stale`,
its default reading; `lru_per_layer`; `lru`) and prefetch (`none`, `score_percentile(p=80)`), device cache 5% of the model's bytes
(`capacity_of=model`), the same eviction in the host tier. Reps alternate the order of the
cells; each cell reports the median and the range of decode tok/s and TTFT over its reps, and
checks every rep generates the same tokens as the others.

Beside each cell: what replay predicts for it — the cell's recorded trace replayed on the
virtual clock with `hardware.preset=cpu` and the storage this script measured on the same
files before the runs (O_DIRECT, one expert per read at queue depth 1: bandwidth; 4 KiB reads:
latency; queue depth = the reader's threads) — and the error `(replay − live) / live`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from moejax import bundled, checkpoint, jobs
from moejax.checkpoint import packed
from moejax.jobs.schema import base_config

PROMPT_IDS = "84,104,101,32,80,121,116,104,111,110,32,105,110,116,101,114,112,114,101,116"
EVICTIONS = ("least_stale", "lru_per_layer", "lru")
PREFETCHES = ("none", "score_percentile(p=80)")
HOSTS = (0.3, 0.6)
PRECISIONS = ("native", "int4")
WORKERS = 8


def measure_disk(path: str, precision: str) -> dict:
    """O_DIRECT reads of the packed files at `precision`: one expert's record at a time (its
    bandwidth) and 4 KiB reads (the latency), both at queue depth 1, in random order."""
    record = checkpoint.read_expert_index(path).records[precision]
    files = [packed.file_path(path, layer, precision)
             for layer in checkpoint.read_config(path).moe_layers]
    rng = np.random.default_rng(0)
    buf = np.empty(record.stride + 4096, np.uint8)
    view = memoryview(buf[-buf.ctypes.data % 4096:][:record.stride])
    times, small = [], []
    for name in rng.permutation(files)[:8]:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECT)
        try:
            n = os.fstat(fd).st_size // record.stride
            for e in rng.permutation(n)[:4]:
                t = time.perf_counter()
                os.preadv(fd, [view], int(e) * record.stride)
                times.append(time.perf_counter() - t)
                t = time.perf_counter()
                os.preadv(fd, [view[:4096]], int(e) * record.stride + 4096 * (e % 2))
                small.append(time.perf_counter() - t)
        finally:
            os.close(fd)
    latency = statistics.median(small)
    gbps = record.stride / max(statistics.median(times) - latency, 1e-9) / 1e9
    return {"read_gbps": round(gbps, 3), "read_latency_s": latency, "queue_depth": WORKERS,
            "expert_bytes": record.stride, "reads": len(times)}


def cell_config(path, precision, host, eviction, prefetch, tokens):
    c = base_config()
    c.model.checkpoint, c.run.prompt_ids, c.run.max_new_tokens = path, PROMPT_IDS, tokens
    c.run.stop_at_eos = False
    c.cache.precision, c.cache.capacity_frac, c.cache.capacity_of = precision, 0.05, "model"
    c.cache.host_capacity_frac, c.cache.host_eviction = host, eviction
    c.policies.eviction, c.policies.prefetch = eviction, prefetch
    c.io.mode, c.io.workers = "direct", WORKERS
    c.log.progress = c.log.tensorboard = False
    return c


def live(path, precision, host, eviction, prefetch, tokens, work) -> dict:
    c = cell_config(path, precision, host, eviction, prefetch, tokens)
    c.clock.kind, c.hardware.preset = "wall", "cpu"
    # The emulated storage and link out of the way: the wall clock measures the real reads.
    c.storage.read_gbps, c.storage.read_latency_s = 1000.0, 0.0
    c.tracing.record = True
    with contextlib.redirect_stdout(io.StringIO()):
        return jobs.run(c, work)


def replayed(path, precision, host, eviction, prefetch, tokens, trace, disk, work) -> dict:
    c = cell_config(path, precision, host, eviction, prefetch, tokens)
    c.job, c.replay.trace, c.clock.kind, c.hardware.preset = "replay", trace, "virtual", "cpu"
    c.model.checkpoint = ""
    c.storage.read_gbps, c.storage.read_latency_s = disk["read_gbps"], disk["read_latency_s"]
    c.storage.queue_depth = disk["queue_depth"]
    with contextlib.redirect_stdout(io.StringIO()):
        return jobs.run(c, work)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="disk_headline_")  # on a disk file system (not tmpfs)
    lines = []

    def say(text=""):
        print(text, flush=True)
        lines.append(text)

    try:
        path = os.path.join(root, "packed")
        checkpoint.copy_in_layout(bundled.EMBEDDED_DIR, path, "packed", precisions=("int4",))
        disks = {p: measure_disk(path, p) for p in PRECISIONS}
        say(f"`python benchmarks/disk_tier_headline.py --tokens={args.tokens} "
            f"--reps={args.reps}` — {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, "
            f"load {os.getloadavg()[0]:.2f}; embedded model, {args.tokens} tokens; files on "
            f"{root} (O_DIRECT)")
        for p, d in disks.items():
            say(f"- disk at {p}: one {d['expert_bytes']}-byte record {d['read_gbps']} GB/s, "
                f"4 KiB {d['read_latency_s'] * 1e6:.0f} µs (QD1, O_DIRECT, {d['reads']} reads)")
        cells = [(p, h, e, f) for p in PRECISIONS for h in HOSTS for e in EVICTIONS
                 for f in PREFETCHES]
        runs = {cell: [] for cell in cells}
        for rep in range(args.reps):
            order = cells if rep % 2 == 0 else cells[::-1]
            for cell in order:
                work = os.path.join(root, f"w{len(runs[cell])}_{cells.index(cell)}")
                runs[cell].append(live(path, *cell, args.tokens, work))
        say()
        say("| precision | host | eviction | prefetch | decode tok/s median (range) | TTFT ms "
            "median (range) | replay tok/s | error | storage wait s, live (median) | storage "
            "stall s, replay | host hit | storage reads | max in flight |")
        say("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for cell in cells:
            rs = runs[cell]
            tokens = {tuple(r["generated_token_ids"]) for r in rs}
            assert len(tokens) == 1, f"{cell}: the reps generated different tokens"
            rate = [r["timings"]["decode_tok_per_s"] for r in rs]
            ttft = [1e3 * r["timings"]["ttft_s"] for r in rs]
            rep = replayed(path, *cell, args.tokens, rs[0]["trace"], disks[cell[0]],
                           os.path.join(root, f"r{cells.index(cell)}"))
            predicted = rep["cache"]["timing"]["decode_tok_per_s"]
            live_rate = statistics.median(rate)
            h = rs[0]["cache"]["host"]
            wait = statistics.median(r["cache"]["host"]["storage_wait_s"] for r in rs)
            stall = rep["cache"]["host"]["total"]["storage_stall_s"]
            say(f"| {cell[0]} | {cell[1]:.0%} | {cell[2]} | {cell[3]} | "
                f"{live_rate:.1f} ({min(rate):.1f}–{max(rate):.1f}) | "
                f"{statistics.median(ttft):.1f} ({min(ttft):.1f}–{max(ttft):.1f}) | "
                f"{predicted:.1f} | {(predicted - live_rate) / live_rate:+.0%} | "
                f"{wait:.3f} | {stall:.3f} | {h['total']['hit_rate']:.1%} | "
                f"{h['total']['storage_reads']} | {h['max_reads_in_flight']} |")
        if args.out:
            with open(args.out, "w") as f:
                f.write("\n".join(lines) + "\n")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
