"""Read bandwidth of `ExpertReader` on the packed layout against a raw sequential read of the same
bytes, one expert and a whole layer, cold and warm.

    python benchmarks/storage_read.py [--dir=DIR] [--reps=5]

The checkpoint is synthetic, written by `checkpoint.save(..., expert_layout="packed")`: one MoE layer
of 64 experts whose native bfloat16 record (H=2048 as OLMoE, I=576) is 6.75 MiB — the size of
Flash-MoE's 4-bit expert. The reader moves raw bytes whatever the precision, so only the record
size matters. The file is ~453 MB, written under `--dir` (default: a temporary directory) and
deleted at the end.

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
and warm rates printed first show whether it took effect. On a virtual machine "cold" means not
in this guest's page cache: the host may still cache the virtual disk. Warm: the same range read
once just before. MB/s are 10^6 bytes per second, the median of `--reps` repetitions; the
ratios are to raw's median in the same case.
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
from moejax.checkpoint import packed
from moejax.checkpoint.expert_reader import ExpertReader
from moejax.checkpoint.params import flat_params
from moejax.families import preset
from moejax.models.decoder import abstract_decoder

EXPERTS = 64
SPLITS = (1, 2, 4, 8)
WORKERS = 8


def synthetic_checkpoint(out: str, expert_layout: str = "packed") -> tuple:
    """A one-layer checkpoint of random bits in `expert_layout`; returns `(cfg, precisions,
    the layer's expert files)`."""
    cfg = dataclasses.replace(preset("olmoe", "tiny"), hidden_size=2048, num_heads=16,
                              num_kv_heads=16, head_dim=128, expert_intermediate_size=576,
                              num_experts=EXPERTS, num_layers=1, moe_layers=(0,),
                              sliding_window=(None,), dtype="bfloat16")
    rng = np.random.default_rng(0)

    def bits(*shape):  # random bfloat16 bit patterns: no float64 temporaries of 450 MB
        return rng.integers(0, 1 << 16, shape, np.uint16).view(ml_dtypes.bfloat16)

    dense = {k: bits(*v.shape) for k, v in flat_params(abstract_decoder(cfg)).items()}
    h, i = cfg.hidden_size, cfg.expert_intermediate_size
    checkpoint.save(out, cfg, dense, [(0, bits(EXPERTS, h, 2 * i), bits(EXPERTS, i, h))],
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


def measure(reps: int, path: str, stride: int, readers: dict, zarr=None) -> dict:
    """`{(case, method): {"cold": [s, ...], "warm": [s, ...]}}`; the methods of a repetition
    run back to back so drift affects them alike. `zarr`: `(reader, files)` of the same experts
    in the zarr layout (TensorStore chunk reads), measured as method "zarr"."""
    buffer = np.empty(EXPERTS * stride, np.uint8)
    times = {}
    with open(path, "rb") as f:
        def raw(first: int, count: int):
            f.seek(first * stride)
            f.readinto(memoryview(buffer)[:count * stride])

        for rep in range(reps):
            expert = (rep * 37) % EXPERTS
            for case in ("expert", "layer"):
                first, count = (expert, 1) if case == "expert" else (0, EXPERTS)
                methods = {"raw": lambda: raw(first, count)}
                for split, reader in readers.items():
                    def read(reader=reader):
                        futures = [reader.submit(0, e, "native")
                                   for e in range(first, first + count)]
                        for fut in futures:
                            fut.result()
                    methods[f"split {split}"] = read
                if zarr is not None:
                    def read_zarr(reader=zarr[0]):
                        for fut in [reader.submit(0, e, "native")
                                    for e in range(first, first + count)]:
                            fut.result()
                    methods["zarr"] = read_zarr
                for method, fn in methods.items():
                    slot = times.setdefault((case, method), {"cold": [], "warm": []})
                    drop_cache(zarr[1] if method == "zarr" else path)
                    slot["cold"].append(timed(fn))
                    fn()
                    slot["warm"].append(timed(fn))
    return times


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to write the checkpoint "
                        "(default: a temporary directory)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="storage_read_", dir=args.dir)
    try:
        cfg, precisions, (path,) = synthetic_checkpoint(os.path.join(root, "ckpt"))
        readers = {s: ExpertReader(os.path.join(root, "ckpt"), cfg, precisions, split=s,
                                   workers=WORKERS) for s in SPLITS}
        _, _, zarr_files = synthetic_checkpoint(os.path.join(root, "zarr"), "zarr")
        zarr = (ExpertReader(os.path.join(root, "zarr"), cfg, precisions, workers=WORKERS),
                zarr_files)
        stride = readers[1].expert_nbytes("native")
        print(f"{os.path.getsize(path) / 1e6:.0f} MB file of {EXPERTS} experts, stride "
              f"{stride} bytes ({stride / 2**20:.2f} MiB); {args.reps} repetitions, medians; "
              f"{os.cpu_count()} CPUs")
        # Other work on the machine competes for the cores the checksums and copies need.
        print(f"1-minute load average before measuring: {os.getloadavg()[0]:.2f}")
        try:
            times = measure(args.reps, path, stride, readers, zarr)
        finally:
            for reader in [*readers.values(), zarr[0]]:
                reader.close()
        sample = np.random.default_rng(1).integers(0, 256, stride, np.uint8)
        crc_s = min(timed(lambda: zlib.crc32(sample)) for _ in range(5))
        print(f"zlib.crc32 on one thread: {stride / crc_s / 1e6:.0f} MB/s (the reader's "
              "checksum; raw has none)")
        raw_expert = times[("expert", "raw")]
        cold, warm = (statistics.median(raw_expert[k]) for k in ("cold", "warm"))
        print(f"fadvise check, raw one expert: cold {stride / cold / 1e6:.0f} MB/s, warm "
              f"{stride / warm / 1e6:.0f} MB/s" + ("" if cold > 1.25 * warm else
                                                   "  <- cold is not slower: pages not dropped?"))
        print()
        print(f"{'case':8s} {'method':8s} {'cold MB/s':>10s} {'warm MB/s':>10s} "
              f"{'cold/raw':>9s} {'warm/raw':>9s}")
        best = {}
        for (case, method), t in times.items():
            nbytes = stride * (1 if case == "expert" else EXPERTS)
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
        print(f"this disk in the virtual clock: --config.storage.read_gbps={best_cold / 1e9:.2f} "
              f"--config.storage.read_latency_s={latency:.1e}  (best cold one-expert rate)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
