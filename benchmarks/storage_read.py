"""Read bandwidth of `ExpertReader` on the packed layout against a raw sequential read of the same
bytes, one expert and a whole layer: pread cold and warm, then the I/O modes (`io.mode`: pread,
mmap) warm, side by side.

    python benchmarks/storage_read.py [--dir=DIR] [--reps=5] [--mode=pread,mmap] [--experts=64]

The checkpoint is synthetic, written by `checkpoint.save(..., expert_layout="packed")`: one MoE layer
of `--experts` (64) experts whose native bfloat16 record (H=2048 as OLMoE, I=576) is 6.75 MiB — the
size of Flash-MoE's 4-bit expert. The reader moves raw bytes whatever the precision, so only the
record size matters. The file is ~453 MB at 64 experts, written under `--dir` (default: a
temporary directory) and deleted at the end.

"zarr" reads the same experts from the zarr layout (one TensorStore chunk per expert and
kind, crc32c-checked) through the same reader and pool: whether the packed layout pays.

Cases: "expert" reads one expert (a different one each repetition); "layer" submits all 64 at
once and waits for them. The reader runs with 8 workers at split 1, 2, 4, 8 and verifies each
expert's crc32 before returning it (that is part of what is timed). "raw" is a plain buffered
`f.readinto` of the same byte range in one thread, into a buffer allocated once (its pages
already mapped, which favours raw), with no checksum.

Cold: before each cold repetition the file's pages are dropped from the page cache with
`os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)` (the file was fsynced, so none is dirty).
That needs no root and touches only this file, unlike /proc/sys/vm/drop_caches; the raw cold
and warm rates printed first show whether it took effect. "Cold" here means not in this guest's
page cache, of a file written moments before: the host may still cache the virtual disk, and
on this VM it does (2.1 GB/s for such reads against 0.8 GB/s for bytes never read since boot).
For the disk's cold figures use `benchmarks/cold_read.py` (O_DIRECT, never-read bytes); this
script compares the reader's methods with one another on equal terms. Warm: the same range read
once just before. MB/s are 10^6 bytes per second, the median of `--reps` repetitions; the
ratios are to raw's median in the same case. This first table is pread's (the default mode) and
is left out when `--mode` does not name pread.

Modes, warm only (`--mode`, default both): the same file read by a pread and an mmap reader at
each split, every method warmed up by one read right before its timed read. The order of the
modes alternates across repetitions (pread first in even ones, mmap first in odd ones) so that
drift and whatever one mode leaves behind fall on both; raw runs first in each. Printed per
method: min / median / max MB/s over the repetitions, the median's ratio to raw's, and mmap's
median over pread's at each split. "Warm" for mmap also means mapped: the reader keeps its
mapping, so after the warm-up read a read takes no page fault, only the checksum over the
mapped pages; pread copies the cached pages into a fresh buffer and checksums that. mmap has no
cold measurement here: pages mapped into a process cannot be dropped with fadvise, which is also
why the mmap readers are opened only after the cold table is measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import tempfile
import time
import zlib

import ml_dtypes
import numpy as np

from moejax import checkpoint
from moejax.checkpoint import IO_MODES, ExpertReader, flat_params, packed
from moejax.families import preset
from moejax.models import abstract_decoder

EXPERTS = 64
SPLITS = (1, 2, 4, 8)
WORKERS = 8


def synthetic_checkpoint(out: str, expert_layout: str = "packed",
                         experts: int = EXPERTS) -> tuple:
    """A one-layer checkpoint of `experts` experts of random bits in `expert_layout`; returns
    `(cfg, precisions, the layer's expert files)`."""
    cfg = dataclasses.replace(preset("olmoe", "tiny"), hidden_size=2048, num_heads=16,
                              num_kv_heads=16, head_dim=128, expert_intermediate_size=576,
                              num_experts=experts, num_layers=1, moe_layers=(0,),
                              sliding_window=(None,), dtype="bfloat16")
    rng = np.random.default_rng(0)

    def bits(*shape):  # random bfloat16 bit patterns: no float64 temporaries of 450 MB
        return rng.integers(0, 1 << 16, shape, np.uint16).view(ml_dtypes.bfloat16)

    dense = {k: bits(*v.shape) for k, v in flat_params(abstract_decoder(cfg)).items()}
    h, i = cfg.hidden_size, cfg.expert_intermediate_size
    checkpoint.save(out, cfg, dense, [(0, bits(experts, h, 2 * i), bits(experts, i, h))],
                expert_layout=expert_layout)
    if expert_layout == "packed":
        files = [packed.file_path(out, 0, "native")]
    else:
        root = os.path.join(out, "experts", "layer_000")
        files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)  # dirty pages cannot be dropped
        os.close(fd)
    return cfg, checkpoint.read_precisions(out), files


def drop_cache(paths) -> None:
    for path in [paths] if isinstance(paths, str) else paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def reading(reader: ExpertReader, first: int, count: int):
    """A function submitting experts `first` .. `first + count - 1` at once and waiting for
    them all (results dropped)."""
    def read():
        futures = [reader.submit(0, e, "native") for e in range(first, first + count)]
        for fut in futures:
            fut.result()
    return read


def raw_reader(f, stride: int, experts: int):
    """`raw(first, count)`: a plain `readinto` of those records into one buffer allocated once."""
    buffer = np.empty(experts * stride, np.uint8)

    def raw(first: int, count: int):
        f.seek(first * stride)
        f.readinto(memoryview(buffer)[:count * stride])
    return raw


def measure(reps: int, path: str, stride: int, readers: dict, zarr=None,
            experts: int = EXPERTS) -> dict:
    """`{(case, method): {"cold": [s, ...], "warm": [s, ...]}}`; the methods of a repetition
    run back to back so drift affects them alike. `readers`: pread readers by split. `zarr`:
    `(reader, files)` of the same experts in the zarr layout (TensorStore chunk reads),
    measured as method "zarr"."""
    times = {}
    with open(path, "rb") as f:
        raw = raw_reader(f, stride, experts)
        for rep in range(reps):
            expert = (rep * 37) % experts
            for case in ("expert", "layer"):
                first, count = (expert, 1) if case == "expert" else (0, experts)
                methods = {"raw": lambda: raw(first, count)}
                for split, reader in readers.items():
                    methods[f"split {split}"] = reading(reader, first, count)
                if zarr is not None:
                    methods["zarr"] = reading(zarr[0], first, count)
                for method, fn in methods.items():
                    slot = times.setdefault((case, method), {"cold": [], "warm": []})
                    drop_cache(zarr[1] if method == "zarr" else path)
                    slot["cold"].append(timed(fn))
                    fn()
                    slot["warm"].append(timed(fn))
    return times


def measure_modes(reps: int, path: str, stride: int, readers: dict, modes: list[str],
                  experts: int = EXPERTS) -> dict:
    """Warm only: `{(case, method): [s, ...]}`, method "raw" or "{mode} s{split}" (`readers`
    by `(mode, split)`). Each method reads once untimed, then once timed; the modes' order
    alternates across repetitions (`modes` in even ones, reversed in odd ones), raw first."""
    times = {}
    splits = sorted({split for _, split in readers})
    with open(path, "rb") as f:
        raw = raw_reader(f, stride, experts)
        for rep in range(reps):
            expert = (rep * 37) % experts
            order = modes if rep % 2 == 0 else modes[::-1]
            for case in ("expert", "layer"):
                first, count = (expert, 1) if case == "expert" else (0, experts)
                methods = {"raw": lambda: raw(first, count)}
                for mode in order:
                    for split in splits:
                        methods[f"{mode} s{split}"] = reading(readers[(mode, split)], first,
                                                              count)
                for method, fn in methods.items():
                    fn()
                    times.setdefault((case, method), []).append(timed(fn))
    return times


def print_modes(times: dict, stride: int, experts: int, modes: list[str],
                splits: list[int]) -> None:
    """The warm table of `measure_modes`: min / median / max MB/s and the median's ratio to
    raw's, per case and method; then mmap's median over pread's at each split."""
    print(f"{'case':8s} {'method':9s} {'min MB/s':>9s} {'median':>9s} {'max MB/s':>9s} "
          f"{'med/raw':>8s}")
    medians = {}
    for case in ("expert", "layer"):
        nbytes = stride * (1 if case == "expert" else experts)
        for method in ["raw"] + [f"{mode} s{split}" for mode in modes for split in splits]:
            rates = sorted(nbytes / t / 1e6 for t in times[(case, method)])
            medians[(case, method)] = statistics.median(rates)
            print(f"{case:8s} {method:9s} {rates[0]:9.0f} {medians[(case, method)]:9.0f} "
                  f"{rates[-1]:9.0f} {medians[(case, method)] / medians[(case, 'raw')]:8.2f}")
    if {"pread", "mmap"} <= set(modes):
        print()
        for case in ("expert", "layer"):
            ratios = ", ".join(f"s{split} {medians[(case, f'mmap s{split}')] / medians[(case, f'pread s{split}')]:.2f}"
                               for split in splits)
            print(f"mmap / pread, median MB/s, {case}: {ratios}")


def cold_read_latency(path: str, samples: int = 33) -> float:
    """Median seconds of one cold 4 KiB read at queue depth 1 (a random page, the file's pages
    dropped before each): the per-read latency `storage.read_latency_s` models."""
    pages = os.path.getsize(path) // 4096
    rng = np.random.default_rng(2)
    fd = os.open(path, os.O_RDONLY)
    try:
        out = []
        for page in rng.integers(0, pages, samples):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            t = time.perf_counter()
            os.pread(fd, 4096, int(page) * 4096)
            out.append(time.perf_counter() - t)
        return statistics.median(out)
    finally:
        os.close(fd)


def parse_modes(text: str) -> list[str]:
    modes = list(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    bad = [m for m in modes if m not in IO_MODES]
    if bad or not modes:
        raise SystemExit(f"--mode={text!r}: give a comma-separated list of {IO_MODES}")
    return modes


def cold_table(args, root: str, cfg, precisions, path: str, stride: int,
               readers: dict) -> None:
    """pread cold and warm against raw and zarr (the first table) and the disk's figures."""
    _, _, zarr_files = synthetic_checkpoint(os.path.join(root, "zarr"), "zarr", args.experts)
    zarr = (ExpertReader(os.path.join(root, "zarr"), cfg, precisions, workers=WORKERS),
            zarr_files)
    try:
        times = measure(args.reps, path, stride, readers, zarr, args.experts)
    finally:
        zarr[0].close()
    raw_expert = times[("expert", "raw")]
    cold, warm = (statistics.median(raw_expert[k]) for k in ("cold", "warm"))
    print(f"fadvise check, raw one expert: cold {stride / cold / 1e6:.0f} MB/s, warm "
          f"{stride / warm / 1e6:.0f} MB/s" + ("" if cold > 1.25 * warm else
                                               "  <- cold is not slower: pages not dropped?"))
    print()
    print("pread (io.mode's default), cold and warm, medians:")
    print(f"{'case':8s} {'method':8s} {'cold MB/s':>10s} {'warm MB/s':>10s} "
          f"{'cold/raw':>9s} {'warm/raw':>9s}")
    best = {}
    for (case, method), t in times.items():
        nbytes = stride * (1 if case == "expert" else args.experts)
        rate = {k: nbytes / statistics.median(v) / 1e6 for k, v in t.items()}
        raw = {k: nbytes / statistics.median(v) / 1e6
               for k, v in times[(case, "raw")].items()}
        ratio = {k: rate[k] / raw[k] for k in rate}
        print(f"{case:8s} {method:8s} {rate['cold']:10.0f} {rate['warm']:10.0f} "
              f"{ratio['cold']:9.2f} {ratio['warm']:9.2f}")
        if method.startswith("split"):
            for k in ("cold", "warm"):
                if ratio[k] > best.get((case, k), ("", 0.0))[1]:
                    best[(case, k)] = (method, ratio[k])
    print()
    for (case, k), (method, ratio) in best.items():
        verdict = "meets" if ratio >= 0.8 else "misses"
        print(f"best {k} {case}: {method}, {ratio:.2f} of raw ({verdict} the 0.8 goal)")
    latency = cold_read_latency(path)
    best_cold = max(stride / statistics.median(t["cold"]) for (case, m), t in times.items()
                    if case == "expert" and m != "raw")
    print(f"cold 4 KiB read at queue depth 1: median {latency * 1e6:.0f} us")
    print(f"fadvise-cold figures (not the disk's: benchmarks/cold_read.py measures those): "
          f"best one-expert {best_cold / 1e9:.2f} GB/s, 4 KiB {latency:.1e} s")
    print()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to write the checkpoint "
                        "(default: a temporary directory)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--mode", default=",".join(IO_MODES),
                        help=f"the reader's io.mode(s) compared warm, comma-separated {IO_MODES}; "
                        "the cold table needs pread")
    parser.add_argument("--experts", type=int, default=EXPERTS,
                        help="experts in the layer file (6.75 MiB each)")
    args = parser.parse_args()
    modes = parse_modes(args.mode)
    root = tempfile.mkdtemp(prefix="storage_read_", dir=args.dir)
    readers = {}
    try:
        ckpt = os.path.join(root, "ckpt")
        cfg, precisions, (path,) = synthetic_checkpoint(ckpt, experts=args.experts)
        stride = checkpoint.read_expert_index(ckpt).records["native"].stride
        print(f"{os.path.getsize(path) / 1e6:.0f} MB file of {args.experts} experts, stride "
              f"{stride} bytes ({stride / 2**20:.2f} MiB); {args.reps} repetitions; "
              f"{os.cpu_count()} CPUs; modes {', '.join(modes)}")
        # Other work on the machine competes for the cores the checksums and copies need.
        print(f"1-minute load average before measuring: {os.getloadavg()[0]:.2f}")
        sample = np.random.default_rng(1).integers(0, 256, stride, np.uint8)
        crc_s = min(timed(lambda: zlib.crc32(sample)) for _ in range(5))
        print(f"zlib.crc32 on one thread: {stride / crc_s / 1e6:.0f} MB/s (the reader's "
              "checksum; raw has none)")
        if "pread" in modes:
            readers.update({("pread", s): ExpertReader(ckpt, cfg, precisions, split=s,
                                                       workers=WORKERS) for s in SPLITS})
            cold_table(args, root, cfg, precisions, path, stride,
                       {s: readers[("pread", s)] for s in SPLITS})
        # The other modes' readers only now: fadvise cannot drop pages mapped in a process.
        for mode in modes:
            if mode != "pread":
                readers.update({(mode, s): ExpertReader(ckpt, cfg, precisions, split=s,
                                                        workers=WORKERS, mode=mode)
                                for s in SPLITS})
        print(f"io.mode warm, min / median / max of {args.reps} repetitions (modes alternate "
              "in order):")
        times = measure_modes(args.reps, path, stride, readers, modes, args.experts)
        print_modes(times, stride, args.experts, modes, list(SPLITS))
    finally:
        for reader in readers.values():
            reader.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
