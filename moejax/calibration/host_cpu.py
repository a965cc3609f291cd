"""The host CPU measured: what one call computing a missed expert on the host takes here, and
the host latency model (`moejax.timing.host`) fitted to it.

    python -m moejax.calibration --workdir=W --host-only [--quick]

On the CPU backend (`jax.devices("cpu")`: the host, on any machine), over one MoE layer's
host table of `experts` experts (OLMoE-1B-7B's shape by default: hidden 2048, expert width
1024, bfloat16, 64 experts; smaller under `--quick`), each call on the next expert in turn so
that its weights come from memory rather than a cache:

* `read`: a jitted sum over one expert's weights (`b` bytes, as 32-bit words): the memory
  bandwidth one host call sees (its seconds less the empty call's);
* `matmul`: a jitted `[T, hidden] @ [hidden, 2 * width]` in the table's dtype (float32
  accumulation), on all threads: the matmul FLOP/s;
* `call`: a jitted call on 4 floats: the per-call overhead of dispatching a computation;
* `dense`: one expert for its `t` tokens as a plain kernel computes it (gate_up, activation,
  down): what a host runtime with a per-expert kernel takes (llama.cpp, Fiddler);
* `live`: the experts step the live runtime runs on the host (`moejax.models.experts.
  expert_outputs` over the host table, the identity slot map, the `t` tokens all routed to
  the one expert): what moejax's own host path takes today.

All alternated (`measure.timed`), min / median / max, for t = 1, 2, 4, ... The model
`call_overhead + max(b / mem_bw, 2 t P / flops)` is fitted (`fit.fit_host`, the bandwidth the
`read`'s) to each of `dense` and `live` (medians), with its residual. The profile written
(`calibrated:<hostname>`) is the fit to `live`: a run with `--config.hardware.file` then
predicts the host path it runs; the `dense` fit is what the same CPU gives a plain kernel
(the figure to compare with presets derived from specifications).
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np

from moejax.calibration import fit
from moejax.calibration.measure import timed
from moejax.models import activation, expert_outputs
from moejax.timing import HostCPU


@dataclasses.dataclass(frozen=True)
class HostPlan:
    hidden: int
    width: int  # the expert's intermediate width
    experts: int  # in the host table
    dtype: str
    tokens: tuple[int, ...]  # of the dense and live calls
    matmul_tokens: int
    reps: int


def host_plan(quick: bool) -> HostPlan:
    """OLMoE-1B-7B's expert shape (1 to 64 tokens), or a quarter of its width and 8 experts
    under `--quick` (the same code paths)."""
    if quick:
        return HostPlan(hidden=512, width=256, experts=8, dtype="bfloat16",
                        tokens=(1, 2, 4, 8, 16), matmul_tokens=256, reps=3)
    return HostPlan(hidden=2048, width=1024, experts=64, dtype="bfloat16",
                    tokens=(1, 2, 4, 8, 16, 32, 64), matmul_tokens=512, reps=5)


def expert_size(plan: HostPlan) -> tuple[int, int]:
    """(parameters, bytes) of one expert: gate, up and down matrices."""
    params = 3 * plan.hidden * plan.width
    return params, params * jnp.dtype(plan.dtype).itemsize


def measure_host(plan: HostPlan) -> dict:
    """The five measurements (module docstring), one `Timing` dict each (`read`, `matmul`,
    `call`) or per token count (`dense`, `live`: lists of rows)."""
    cpu = jax.devices("cpu")[0]
    dtype = jnp.dtype(plan.dtype)
    h, w, e = plan.hidden, plan.width, plan.experts
    # Weights of a fixed small value: the time does not depend on them, and filling is fast.
    gate_up = jnp.full((e, h, 2 * w), 0.01, dtype, device=cpu)
    down = jnp.full((e, w, h), 0.01, dtype, device=cpu)
    identity = jax.device_put(np.arange(e, dtype=np.int32), cpu)
    act = activation("silu")

    @jax.jit
    def read(i, gate_up, down):  # the bytes as 32-bit words: an integer sum, the fastest read
        return jnp.sum(_words(gate_up[i])) + jnp.sum(_words(down[i]))

    @jax.jit
    def matmul(x, i, gate_up):
        return jnp.dot(x, gate_up[i], preferred_element_type=jnp.float32)

    @jax.jit
    def dense(x, i, gate_up, down):
        g = jnp.dot(x, gate_up[i], preferred_element_type=jnp.float32)
        a = (act(g[:, :w]) * g[:, w:]).astype(x.dtype)
        return jnp.dot(a, down[i], preferred_element_type=jnp.float32).astype(x.dtype)

    live = jax.jit(expert_outputs)
    tiny = jax.device_put(np.ones(4, np.float32), cpu)
    call = jax.jit(lambda a: a + 1)
    turn = itertools.count()  # the next expert, for every call that reads one

    def next_expert():
        return jax.device_put(np.int32(next(turn) % e), cpu)

    runs = {("read", 0): lambda: read(next_expert(), gate_up, down).block_until_ready(),
            ("call", 0): lambda: call(tiny).block_until_ready()}
    x_mm = jnp.full((plan.matmul_tokens, h), 0.5, dtype, device=cpu)
    runs[("matmul", plan.matmul_tokens)] = (
        lambda: matmul(x_mm, next_expert(), gate_up).block_until_ready())
    for t in plan.tokens:
        x = jnp.full((t, h), 0.5, dtype, device=cpu)
        weights = jax.device_put(np.ones((t, 1), np.float32), cpu)
        ids_of = [jax.device_put(np.full((t, 1), i, np.int32), cpu) for i in range(e)]
        runs[("dense", t)] = (
            lambda x=x: dense(x, next_expert(), gate_up, down).block_until_ready())
        runs[("live", t)] = (
            lambda x=x, weights=weights, ids_of=ids_of: live(
                x, ids_of[next(turn) % e], weights, gate_up, down, identity
            ).block_until_ready())
    got = timed(runs, plan.reps)
    return {"read": got[("read", 0)].to_dict(), "call": got[("call", 0)].to_dict(),
            "matmul": {"tokens": plan.matmul_tokens,
                       **got[("matmul", plan.matmul_tokens)].to_dict()},
            "dense": [{"tokens": t, **got[("dense", t)].to_dict()} for t in plan.tokens],
            "live": [{"tokens": t, **got[("live", t)].to_dict()} for t in plan.tokens]}


def _words(a: jax.Array) -> jax.Array:
    """`a`'s bytes as uint32 words (a float sum of bfloat16 converts every element and reads
    slower than the memory delivers)."""
    per_word = 4 // a.dtype.itemsize
    if per_word > 1:  # (the last axis split, not a flat [-1, 2]: XLA's CPU loops run slow
        # over a minor axis of 2)
        a = a.reshape(*a.shape[:-1], a.shape[-1] // per_word, per_word)
    return jax.lax.bitcast_convert_type(a, jnp.uint32)


def rates(plan: HostPlan, timings: dict) -> dict:
    """The rates the microbenchmarks show (medians): `mem_gbps` (one expert's bytes over the
    read's seconds less the empty call's), `matmul_tflops`, `call_overhead_s`."""
    params, nbytes = expert_size(plan)
    overhead = timings["call"]["median_s"]
    read_s = max(timings["read"]["median_s"] - overhead, 0.5 * timings["read"]["median_s"])
    flops = 2.0 * timings["matmul"]["tokens"] * plan.hidden * 2 * plan.width
    return {"mem_gbps": nbytes / read_s / 1e9,
            "matmul_tflops": flops / timings["matmul"]["median_s"] / 1e12,
            "call_overhead_s": overhead}


def fits(plan: HostPlan, timings: dict, mem_gbps: float) -> dict[str, fit.HostFit]:
    """The host model fitted to the `dense` and the `live` calls (medians)."""
    params, nbytes = expert_size(plan)
    return {kind: fit.fit_host([r["tokens"] for r in timings[kind]],
                               [r["median_s"] for r in timings[kind]], params, nbytes,
                               mem_gbps)
            for kind in ("dense", "live")}


def threads() -> int:
    """The host's threads XLA's CPU backend runs a call on (those this process may use)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        return os.cpu_count() or 1


def profile_of(live: fit.HostFit, name: str) -> HostCPU:
    """The profile of the host path measured (`live`'s fit), validated; `d2h_gbps` None (the
    host link's rate: on a CPU backend there is no link to measure)."""
    host = HostCPU(name, mem_gbps=live.mem_gbps, tflops=live.tflops, threads=threads(),
                   call_overhead_s=live.call_overhead_s, d2h_gbps=None)
    host.validate()
    return host


def section(plan: HostPlan, timings: dict, name: str) -> dict:
    """hardware.json's `host` object: `profile` (a `HostCPU`, what `moejax.timing.host.
    from_file` reads) and `measured` (every timing, the rates and both fits)."""
    measured_rates = rates(plan, timings)
    fitted = fits(plan, timings, measured_rates["mem_gbps"])
    host = profile_of(fitted["live"], name)
    params, nbytes = expert_size(plan)
    for kind in ("dense", "live"):
        for row in timings[kind]:
            row["model_s"] = float(fitted[kind].seconds(row["tokens"], params, nbytes))
    return {"profile": dataclasses.asdict(host),
            "measured": {"plan": dataclasses.asdict(plan), "expert_params": params,
                         "expert_bytes": nbytes, "timings": timings, "rates": measured_rates,
                         "fit_dense": fitted["dense"].to_dict(),
                         "fit_live": fitted["live"].to_dict(),
                         "what": ("seconds per call on this machine's wall clock (min / "
                                  "median / max of alternated reps); the profile is fit_live "
                                  "(moejax's host path), fit_dense a plain per-expert kernel "
                                  "on the same CPU")}}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def table(host_section: dict) -> str:
    """The host's measurements and fits, as calibrate prints them."""
    m = host_section["measured"]
    plan, t, r = m["plan"], m["timings"], m["rates"]
    lines = [f"host CPU ({threads()} threads; one expert of hidden {plan['hidden']} x width "
             f"{plan['width']}, {plan['dtype']}, {m['expert_bytes'] / 1e6:.2f} MB, "
             f"{plan['experts']} in the table; this machine's wall clock, median of "
             f"{plan['reps']} [min, max]):",
             f"  read one expert {_ms(t['read']['median_s'])} ms: {r['mem_gbps']:.2f} GB/s; "
             f"matmul of {t['matmul']['tokens']} tokens: {r['matmul_tflops']:.3f} TFLOP/s; "
             f"empty call {t['call']['median_s'] * 1e6:.1f} us",
             f"  {'tokens':>6s} | {'dense ms':>9s} {'[min, max]':>19s} {'model':>8s} | "
             f"{'live ms':>9s} {'[min, max]':>19s} {'model':>8s}"]
    for d, v in zip(t["dense"], t["live"]):
        cells = []
        for row in (d, v):
            span = f"[{_ms(row['min_s'])}, {_ms(row['max_s'])}]"
            cells.append(f"{_ms(row['median_s']):>9s} {span:>19s} {_ms(row['model_s']):>8s}")
        lines.append(f"  {d['tokens']:>6d} | {cells[0]} | {cells[1]}")
    for kind in ("dense", "live"):
        f = m[f"fit_{kind}"]
        bound = "" if f["determined"]["tflops"] else " (a lower bound: no call was compute-bound)"
        lines.append(f"  fit, {kind}: {f['call_overhead_s'] * 1e6:.1f} us + max(bytes / "
                     f"{f['mem_gbps']:.2f} GB/s, 2 t P / {f['tflops']:.4g} TFLOP/s{bound}); "
                     f"residual rms {100 * f['rms_rel']:.1f}%, max {100 * f['max_rel']:.1f}%")
    p = host_section["profile"]
    lines.append(f"  profile {p['name']} (the live fit): {p['mem_gbps']:.3g} GB/s, "
                 f"{p['tflops']:.4g} TFLOP/s, {p['call_overhead_s'] * 1e6:.1f} us per call, "
                 f"{p['threads']} threads")
    return "\n".join(lines)
