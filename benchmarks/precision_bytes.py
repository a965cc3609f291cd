"""Host->device bytes per generated token at each precision, live, on the embedded model.

    python benchmarks/precision_bytes.py

The generate job with SpecMD's paper configuration at 5% of the model's bytes
(`configs/olmoe_5pct.py:scale=tiny`: capacity_of=model, Least-Stale, score-percentile
prefetch), 64 new tokens of the default prompt, once per plain precision and once with the
precision cascade. Prints the slots, hit rate, H2D bytes per generated token (prefill
included, demand + prefetch) and the virtual-clock TTFT and decode rate at SpecMD's 5 GB/s.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile

from moejax import jobs
from moejax.testing import config_from_flags

RUNS = [("native", []), ("int8", ["--config.cache.precision=int8"]),
        ("int4", ["--config.cache.precision=int4"]), ("int2", ["--config.cache.precision=int2"]),
        ("fetch_priority int8:int4:int2",
         ['--config.policies.miss=fetch_priority(levels="int8:int4:int2", percentile=60)']),
        ("specmd_3 at int4", ["--config.policies.preset=specmd_3",
                              "--config.cache.precision=int4"])]
TOKENS = 64


def main():
    print(f"{'run':32s} {'slots':>16s} {'hit':>6s} {'KB/token':>9s} {'TTFT ms':>8s} "
          f"{'tok/s':>7s}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in RUNS:
            c = config_from_flags("configs/olmoe_5pct.py:scale=tiny", *flags,
                                  f"--config.run.max_new_tokens={TOKENS}",
                                  "--config.run.stop_at_eos=False", "--config.log.progress=False",
                                  "--config.log.tensorboard=False")
            with contextlib.redirect_stdout(io.StringIO()):  # the job's own table
                cache = jobs.run(c, os.path.join(tmp, name.split()[0]))["cache"]
            t, tm = cache["total"], cache["timing"]
            slots = "+".join(f"{v['slots']}" for v in cache["pools"].values())
            print(f"{name:32s} {slots:>16s} {t['hit_rate']:6.1%} "
                  f"{t['h2d_bytes'] / TOKENS / 1e3:9.1f} {tm['ttft_s'] * 1e3:8.2f} "
                  f"{tm['decode_tok_per_s']:7.0f}")


if __name__ == "__main__":
    main()
