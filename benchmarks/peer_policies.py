"""The peers' policies on every shipped real capture, against the built-in ones they compete
with: `cooccur` against `temporal` (prediction recall and precision), and `s3fifo`, `arc`
against `lru` and `least_stale` (hits, collision misses and the modelled decode speed).

    python benchmarks/peer_policies.py [--traces=olmoe_code,...] [--slots=256]

Each row is one replay job:

    python -m moejax.main --config=configs/replay.py --config.cache.slots=SLOTS \\
        --config.replay.trace=moejax/assets/captures/CAPTURE.jsonl \\
        --config.model.family=F --config.model.preset=P FLAGS --workdir=W

with the capture's model named (its expert bytes give the virtual clock's times: SpecMD's A100
profile at 5 GB/s, the default hardware) and FLAGS in the row. The captures are
replayed as recorded (one sequence, decode passes only), so decode is the only speed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile

from moejax import bundled, jobs
from moejax.testing import config_from_flags

PREFETCH_ROWS = [("temporal", {"policies.prefetch": "temporal"}),
                 ("cooccur", {"policies.prefetch": "cooccur"}),
                 ("cooccur(overfetch=1.5)", {"policies.prefetch": "cooccur(overfetch=1.5)"})]
EVICTION_ROWS = [(e, {"policies.eviction": e, "policies.prefetch": "none"})
                 for e in ("lru", "least_stale", "s3fifo", "arc")]


def run(path: str, slots: int, overrides: dict) -> dict:
    family, preset = bundled.capture_model(path)
    flags = [f"--config.cache.slots={slots}", f"--config.replay.trace={path}",
             f"--config.model.family={family}", f"--config.model.preset={preset}",
             "--config.log.progress=False", "--config.log.tensorboard=False"]
    flags += [f"--config.{k}={v}" for k, v in overrides.items()]
    c = config_from_flags("configs/replay.py", *flags)
    with tempfile.TemporaryDirectory() as workdir, contextlib.redirect_stdout(io.StringIO()):
        return jobs.run(c, workdir)["cache"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [os.path.splitext(os.path.basename(p))[0] for p in bundled.capture_files()]
    ap.add_argument("--traces", default=",".join(names),
                    help=f"comma-separated capture names (default: all: {','.join(names)})")
    ap.add_argument("--slots", type=int, default=256, help="cache slots (default %(default)s)")
    args = ap.parse_args(argv)
    paths = {os.path.splitext(os.path.basename(p))[0]: p for p in bundled.capture_files()}
    unknown = [t for t in args.traces.split(",") if t not in paths]
    if unknown:
        sys.exit(f"--traces: unknown capture(s) {unknown}; the shipped ones are {names}")
    traces = args.traces.split(",")
    print(f"Prefetch under least_stale, {args.slots} slots\n")
    print("| capture | prefetch | recall | precision | hit rate | collision misses | "
          "decode tok/s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for trace in traces:
        for label, o in PREFETCH_ROWS:
            c = run(paths[trace], args.slots, o)
            t = c["total"]
            print(f"| {trace} | {label} | {t['prediction_recall']:.3f} | "
                  f"{t['prediction_precision']:.3f} | {t['hit_rate']:.3f} | "
                  f"{t['collision_misses']:,} | {c['timing']['decode_tok_per_s']:.1f} |",
                  flush=True)
    print(f"\nEviction without prefetch, {args.slots} slots\n")
    print("| capture | eviction | hit rate | collision misses | decode tok/s | stall s |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for trace in traces:
        for label, o in EVICTION_ROWS:
            c = run(paths[trace], args.slots, o)
            t = c["total"]
            print(f"| {trace} | {label} | {t['hit_rate']:.3f} | {t['collision_misses']:,} | "
                  f"{c['timing']['decode_tok_per_s']:.1f} | {t['stall_s']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
