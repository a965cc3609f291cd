"""The disk tier live on this machine's disk: the embedded model generating with its experts on
storage, zarr (the shipped checkpoint, blosc-compressed chunks) against the packed layout, read
split 1 and 4, a host tier of 30%, against everything in host memory; wall clock.

    python benchmarks/disk_tier_live.py [--tokens=48] [--reps=3]

The packed copy is written to a temporary directory (native experts only). Before each run the
expert files' pages are dropped from the page cache (`posix_fadvise(DONTNEED)`); that makes
only each file's *first* read cold: an expert read again in the same run (the host tier
evicted it) comes from the page cache, and on a VM a dropped page may still be in the
hypervisor's cache. For cold reads every time, see `disk_tier_headline.py` (`io.mode=direct`).
The virtual storage and transfer model is made negligible (`storage.read_gbps=1000`, zero latency, `hardware.preset=cpu`) so the wall
clock measures the real reads, not an emulated bandwidth. Decode tok/s and TTFT are the host
wall clock's after the warm-up (`timings`), medians over `--reps`; every run generates the
same tokens, which the script checks.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import tempfile

from moejax import bundled, checkpoint, jobs
from moejax.jobs.schema import base_config

PROMPT_IDS = "84,104,101,32,80,121,116,104,111,110,32,105,110,116,101,114,112,114,101,116"


def expert_files(path: str) -> list[str]:
    root = os.path.join(path, "experts")
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]


def drop_cache(files: list[str]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run(path: str, host: float, split: int, tokens: int, work: str) -> dict:
    c = base_config()
    c.model.checkpoint, c.run.prompt_ids, c.run.max_new_tokens = path, PROMPT_IDS, tokens
    c.run.stop_at_eos = False
    c.clock.kind, c.hardware.preset = "wall", "cpu"
    c.cache.host_capacity_frac, c.io.split = host, split
    c.storage.read_gbps, c.storage.read_latency_s = 1000.0, 0.0
    c.log.progress = c.log.tensorboard = False
    drop_cache(expert_files(path))
    with contextlib.redirect_stdout(io.StringIO()):  # the job's own cache table
        return jobs.run(c, work)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="disk_tier_live_")
    try:
        packed = os.path.join(root, "packed")
        checkpoint.copy_in_layout(bundled.EMBEDDED_DIR, packed, "packed")
        cases = [("in memory", bundled.EMBEDDED_DIR, 1.0, 1)]
        for name, path in (("zarr", bundled.EMBEDDED_DIR), ("packed", packed)):
            for split in ((1,) if name == "zarr" else (1, 4)):
                cases.append((f"{name} split {split}", path, 0.3, split))
        print(f"embedded model, {args.tokens} new tokens, host tier 30% (1.0: all in memory), "
              f"wall clock, medians of {args.reps}; {os.cpu_count()} CPUs, load "
              f"{os.getloadavg()[0]:.2f}")
        print(f"{'case':18s} {'decode tok/s':>12s} {'TTFT ms':>8s} {'storage reads':>13s} "
              f"{'host hit':>8s}")
        tokens = None
        for name, path, host, split in cases:
            runs = [run(path, host, split, args.tokens, os.path.join(root, f"w{i}"))
                    for i in range(args.reps)]
            for r in runs:
                tokens = tokens or r["generated_token_ids"]
                assert r["generated_token_ids"] == tokens, f"{name}: tokens differ"
            rate = statistics.median(r["timings"]["decode_tok_per_s"] for r in runs)
            ttft = statistics.median(r["timings"]["ttft_s"] for r in runs)
            h = runs[0]["cache"].get("host", {}).get("total", {})
            print(f"{name:18s} {rate:12.1f} {1e3 * ttft:8.1f} "
                  f"{h.get('storage_reads', 0):13d} "
                  f"{100 * (h.get('hit_rate') or 0):7.1f}%")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
