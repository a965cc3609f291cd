"""Cold reads that are cold: this machine's disk measured with `O_DIRECT` on bytes never read
since boot, against re-reads of the same bytes and against bytes written just now — the
figures `THIS_DISK` (studies/dossier/grid_disk.py) gives the virtual clock.

    python benchmarks/cold_read.py [--dir=DIR] [--reps=5] [--record_mib=6.75]

Every read here is `os.preadv` through an `O_DIRECT` descriptor into a page-aligned buffer:
the guest's page cache is bypassed, so no read is served from this kernel's memory. What
`O_DIRECT` cannot bypass on a virtual machine is the host: the hypervisor (or the storage
behind it) may cache the virtual disk. Three kinds of bytes tell them apart:

- **first**: regions of files on the same file system as `--dir` that no one has read since
  boot — regular files of at least 64 MiB whose access time is older than both the boot and
  24 hours (with `relatime` a read updates an access time older than 24 hours, so such a file
  has not been read since). Each region is read once, never twice across repetitions; the
  regions are random within a file, and a run uses up one file before it touches the next
  (a file touched at all is not looked for again). These are the disk (or the host's cold
  path), as a freshly booted serving process would see a checkpoint.
- **re-read**: the same regions, read again right after (still `O_DIRECT`). Faster than first
  means something below the guest caches them.
- **written**: a file of random bytes written (and fsynced) by this script just before, read
  with `O_DIRECT`: what a benchmark that writes its checkpoint and drops the page cache with
  `posix_fadvise(DONTNEED)` measures (the earlier `THIS_DISK` was measured so).

Cases: "4 KiB QD1" (one page at a time: the per-read latency `storage.read_latency_s`
models), "record QD1" (one record of `--record_mib`, OLMoE's 6.75 MiB native expert by
default, at a time) and "record QD8" (eight records at once on eight threads, as the reader's
pool issues a wave's reads: the shared bandwidth `storage.read_gbps` models). Each repetition
measures every kind and case on regions of its own; the order of the cases alternates
(forward in even repetitions, backward in odd ones) so drift falls on all. Printed: min /
median / max over the repetitions, and the `THIS_DISK` values from the medians of the first
reads. A repetition's first reads consume never-read regions; the script stops with a message
when none are left.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from moejax.checkpoint import PAGE, page_aligned

MIN_FILE = 64 << 20
DAY_S = 24 * 3600
QUEUE = 8
PAGES_PER_REP = 32
KINDS = ("first", "re-read", "written")
CASES = ("4 KiB QD1", "record QD1", f"record QD{QUEUE}")


def boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise SystemExit("cold_read: /proc/stat has no boot time (btime); Linux only")


def untouched_files(root: str, device: int) -> list[str]:
    """Regular files of at least `MIN_FILE` bytes under `root` on `device`, not read since
    boot (access time older than the boot and than 24 hours)."""
    cutoff = min(boot_time(), time.time() - DAY_S)
    found = []
    for top, dirs, files in os.walk(root):
        try:
            if os.stat(top).st_dev != device:
                dirs[:] = []
                continue
        except OSError:
            continue
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
        for name in files:
            path = os.path.join(top, name)
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            if (st.st_dev == device and st.st_size >= MIN_FILE and st.st_atime < cutoff
                    and os.access(path, os.R_OK) and not os.path.islink(path)):
                found.append(path)
    return found


class Regions:
    """Never-read regions of `size` bytes (page-aligned) across `files`, handed out once each:
    the files in random order, a file's regions in random order, one file used up before the
    next is touched (a file read at all no longer counts as never read on a later run, so a
    run spends as few files as it can)."""

    def __init__(self, files: list[str], size: int, seed: int):
        rng = np.random.default_rng(seed)
        self.size = size
        self._blocks = []
        for f in rng.permutation(len(files)):
            path = files[int(f)]
            blocks = os.path.getsize(path) // size
            self._blocks += [(path, int(i) * size) for i in rng.permutation(blocks)]

    def take(self, n: int) -> list[tuple[str, int]]:
        if len(self._blocks) < n:
            raise SystemExit("cold_read: no never-read regions left on this file system (every "
                             "large file has been read since boot); reboot, or point --dir at "
                             "another file system")
        out, self._blocks = self._blocks[:n], self._blocks[n:]
        return out


def read_direct(path: str, offset: int, nbytes: int, buffer: np.ndarray) -> float:
    """Seconds to read `nbytes` at `offset` of `path` with O_DIRECT into `buffer`."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        view = memoryview(buffer)[:nbytes]
        start = time.perf_counter()
        done = 0
        while done < nbytes:
            n = os.preadv(fd, [view[done:]], offset + done)
            if n == 0:
                break
            done += n
        return time.perf_counter() - start
    finally:
        os.close(fd)


def timed_batch(regions: list[tuple[str, int]], nbytes: int, buffers: list[np.ndarray],
                pool: concurrent.futures.ThreadPoolExecutor | None) -> float:
    """Wall seconds to read every region (`nbytes` at its offset): one after another, or all
    at once on `pool`."""
    start = time.perf_counter()
    if pool is None:
        for (path, offset), buffer in zip(regions, buffers):
            read_direct(path, offset, nbytes, buffer)
    else:
        list(pool.map(lambda a: read_direct(a[0][0], a[0][1], nbytes, a[1]),
                      zip(regions, buffers)))
    return time.perf_counter() - start


def write_file(directory: str, nbytes: int) -> str:
    """A file of random bytes, fsynced: 'written' reads come from it."""
    fd, path = tempfile.mkstemp(prefix="cold_read_", dir=directory)
    rng = np.random.default_rng(1)
    with os.fdopen(fd, "wb") as f:
        left = nbytes
        while left:
            chunk = min(left, 64 << 20)
            f.write(rng.integers(0, 256, chunk, np.uint8).tobytes())
            left -= chunk
        f.flush()
        os.fsync(f.fileno())
    return path


def measure(args, first: Regions, pages: Regions, written: str, record: int) -> dict:
    """`{(kind, case): [MB/s or seconds per read, one per repetition]}`."""
    out: dict = {}
    buffers = [page_aligned(record) for _ in range(QUEUE)]
    page_buffers = [page_aligned(PAGE) for _ in range(PAGES_PER_REP)]
    written_blocks = os.path.getsize(written) // record
    written_pages = os.path.getsize(written) // PAGE
    rng = np.random.default_rng(3)
    with concurrent.futures.ThreadPoolExecutor(QUEUE) as pool:
        for rep in range(args.reps):
            cases = CASES if rep % 2 == 0 else CASES[::-1]
            for case in cases:
                if case == "4 KiB QD1":
                    regions = pages.take(PAGES_PER_REP)
                    fresh = [(written, int(p) * PAGE)
                             for p in rng.choice(written_pages, PAGES_PER_REP, replace=False)]
                    for kind, rs in (("first", regions), ("re-read", regions),
                                     ("written", fresh)):
                        t = timed_batch(rs, PAGE, page_buffers, None) / len(rs)
                        out.setdefault((kind, case), []).append(t)
                    continue
                n = QUEUE
                regions = first.take(n)
                fresh = [(written, int(b) * record)
                         for b in rng.choice(written_blocks, n, replace=False)]
                on = pool if case.endswith(f"QD{QUEUE}") else None
                for kind, rs in (("first", regions), ("re-read", regions), ("written", fresh)):
                    t = timed_batch(rs, record, buffers, on)
                    out.setdefault((kind, case), []).append(n * record / t / 1e6)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(),
                    help="a directory on the file system to measure (the 'written' file goes "
                    "there; never-read files are looked for on the same file system)")
    ap.add_argument("--root", default="/", help="where to look for never-read files")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--record_mib", type=float, default=6.75,
                    help="bytes of one record read, in MiB (rounded to whole pages)")
    ap.add_argument("--seed", type=int, default=None,
                    help="which never-read regions (default: from the clock, so a rerun "
                    "does not pick regions an earlier run has read)")
    args = ap.parse_args()
    if args.reps < 1 or args.record_mib <= 0:
        ap.error("--reps must be >= 1 and --record_mib > 0")
    if not os.path.isdir(args.dir):
        ap.error(f"--dir={args.dir}: not a directory")
    record = max(PAGE, int(args.record_mib * 2**20) // PAGE * PAGE)
    device = os.stat(args.dir).st_dev
    seed = args.seed if args.seed is not None else time.time_ns() % 2**32
    started = time.time()
    files = untouched_files(args.root, device)
    size = sum(os.path.getsize(f) for f in files)
    print(f"{len(files)} never-read files ({size / 1e9:.1f} GB) on the file system of "
          f"{args.dir}, found in {time.time() - started:.0f} s; up "
          f"{(time.time() - boot_time()) / 3600:.1f} h; record {record} bytes; {args.reps} "
          f"repetitions; seed {seed}; load average {os.getloadavg()[0]:.2f}")
    if len(files) < 2:
        print("cold_read: fewer than two never-read files on this file system",
              file=sys.stderr)
        return 1
    # Pages come from one file and records from the others, so no page read is inside a
    # record region read later (which would then not be a first read).
    files.sort(key=os.path.getsize)
    page_files, record_files = files[:1], files[1:]
    need = args.reps * 2 * QUEUE * record
    written = write_file(args.dir, max(need, 256 << 20))
    try:
        out = measure(args, Regions(record_files, record, seed),
                      Regions(page_files, PAGE, seed + 1), written, record)
    finally:
        os.unlink(written)
    print(f"\n{'kind':8s} {'case':12s} {'min':>9s} {'median':>9s} {'max':>9s}")
    for case in CASES:
        unit = "us" if case.startswith("4 KiB") else "MB/s"
        for kind in KINDS:
            values = sorted(out[(kind, case)])
            scale = 1e6 if unit == "us" else 1.0
            lo, med, hi = (v * scale for v in (values[0], statistics.median(values),
                                                values[-1]))
            print(f"{kind:8s} {case:12s} {lo:9.0f} {med:9.0f} {hi:9.0f}  {unit}")
    latency = statistics.median(out[("first", "4 KiB QD1")])
    gbps = statistics.median(out[("first", f"record QD{QUEUE}")]) / 1e3
    print(f"\nTHIS_DISK from the first reads' medians: storage.read_gbps={gbps:.2f} "
          f"storage.read_latency_s={latency:.1e} storage.queue_depth={QUEUE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
