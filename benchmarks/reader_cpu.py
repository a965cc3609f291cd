"""The expert reader's CPU cost per GB: reads into reused buffers (`checkpoint.read_buffers`,
the default) against a fresh buffer per read, warm (`io.mode=pread`, pages in the page cache)
and cold (`io.mode=direct`, O_DIRECT: from the disk every time).

    python benchmarks/reader_cpu.py [--dir=DIR] [--reps=5] [--experts=32] [--passes=3]

The checkpoint is `storage_read.py`'s synthetic one-layer packed checkpoint (records of 6.75
MiB, OLMoE's native expert). One measurement reads every expert of the layer `--passes` times,
a pass at a time (all of a pass's reads submitted at once to the reader's 8 workers, results
dropped before the next pass, as the host tier lets entries go), and takes the process's CPU
time (all threads: user + system, `os.times`) and the wall time. CPU per GB is CPU seconds
over the GB read (1e9 bytes); it includes the crc32 of every record (the reader verifies
each one) and, for fresh buffers, the page faults and zeroing of each new buffer's pages.
The four methods run back to back in each repetition, in alternating order (forward in even
repetitions, backward in odd ones); printed: min / median / max over the repetitions and the
median's ratio reused / fresh.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from storage_read import synthetic_checkpoint  # benchmarks/ is the script's directory

from moejax import checkpoint
from moejax.checkpoint import ExpertReader

WORKERS = 8
METHODS = (("pread", True), ("pread", False), ("direct", True), ("direct", False))


def label(mode: str, reuse: bool) -> str:
    return f"{mode} {'reused' if reuse else 'fresh'}"


def one_run(reader: ExpertReader, experts: int, passes: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of `passes` passes over the layer's experts."""
    t0, c0 = time.perf_counter(), os.times()
    for _ in range(passes):
        futures = [reader.submit(0, e, "native") for e in range(experts)]
        for future in futures:
            future.result()
        del futures
    c1 = os.times()
    return (c1.user - c0.user) + (c1.system - c0.system), time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="where to write the checkpoint (default: a "
                    "temporary directory; it must take O_DIRECT: not tmpfs)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    if min(args.reps, args.experts, args.passes) < 1:
        ap.error("--reps, --experts and --passes must be >= 1")
    root = tempfile.mkdtemp(prefix="reader_cpu_", dir=args.dir)
    readers = {}
    try:
        ckpt = os.path.join(root, "ckpt")
        cfg, precisions, (path,) = synthetic_checkpoint(ckpt, experts=args.experts)
        stride = checkpoint.read_expert_index(ckpt).records["native"].stride
        gb = args.experts * args.passes * stride / 1e9
        print(f"{args.experts} experts of {stride} bytes, {args.passes} passes = {gb:.2f} GB "
              f"per measurement; {args.reps} repetitions; {os.cpu_count()} CPUs; load average "
              f"{os.getloadavg()[0]:.2f}")
        readers = {m: ExpertReader(ckpt, cfg, precisions, workers=WORKERS, mode=m[0],
                                   reuse_buffers=m[1]) for m in METHODS}
        for reader in readers.values():  # warm: the page cache for pread, the pools for all
            one_run(reader, args.experts, 1)
        cpu = {m: [] for m in METHODS}
        rate = {m: [] for m in METHODS}
        for rep in range(args.reps):
            for m in (METHODS if rep % 2 == 0 else METHODS[::-1]):
                c, w = one_run(readers[m], args.experts, args.passes)
                cpu[m].append(c / gb)
                rate[m].append(gb * 1e3 / w)
        print(f"\n{'method':14s} {'CPU s/GB min':>13s} {'median':>7s} {'max':>6s}   "
              f"{'MB/s min':>9s} {'median':>7s} {'max':>6s}")
        for m in METHODS:
            c, r = sorted(cpu[m]), sorted(rate[m])
            print(f"{label(*m):14s} {c[0]:13.3f} {statistics.median(c):7.3f} {c[-1]:6.3f}   "
                  f"{r[0]:9.0f} {statistics.median(r):7.0f} {r[-1]:6.0f}")
        print()
        for mode in ("pread", "direct"):
            ratio = statistics.median(cpu[(mode, True)]) / statistics.median(cpu[(mode, False)])
            print(f"{mode}: CPU per GB, reused / fresh buffers (medians): {ratio:.2f}")
        held = readers[("pread", True)].buffer_stats()
        print(f"pread reused: {held['taken']} reads into {held['allocated']} buffers")
    finally:
        for reader in readers.values():
            reader.close()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
