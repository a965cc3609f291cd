"""Host CPU profiles: the host that computes missed experts (Fiddler, llama.cpp's `--n-cpu-moe`)
as the clocks model it. Presets are config values (`host.preset`); every field can be
overridden (`--config.host.mem_gbps=40`): a field left None keeps the preset's value, any given
value (0 included) replaces it and is validated.

The host latency model (Fiddler's: the host's time grows with the tokens routed to an expert;
an expert's weights are read once per call, whatever its tokens). One call computes one
expert for the `t` tokens routed to it, on all the host's threads, from its host-resident
weights (`b` bytes at the precision the host holds, `P` parameters):

    expert_s(t) = call_overhead_s + max(b / mem_bw, 2 * t * P / flops)

a roofline per call (reading the weights, or the matmuls' FLOPs, whichever is longer) plus a
fixed cost (dispatching the call to the thread pool and joining it). A layer's host experts
are called one after another, each on every thread (as a CPU matmul library runs them), so
the host's compute for a layer is the sum of its experts' `expert_s`: several experts at once
would share the same memory bandwidth, and one call of 1 token already waits on it.

The activations move with the calls (`moejax/cache/host_path.py` books them):

    down_s = h2d_latency_s + tokens_down * hidden * dtype_bytes / d2h_bw
    back_s = h2d_latency_s + host_pairs * hidden * 4 / link_bw

`tokens_down`: the distinct tokens with at least one contribution computed on the host (each
hidden state crosses once); `host_pairs`: those contributions, returned one by one in float32
(the experts step carries a layer's contributions in float32 and sums them once, so a host
contribution added there gives the resident model's sum). `d2h_bw` is `d2h_gbps`, or the host
link's rate (`hardware.link_gbps`) when None; `link_bw` is the host link's rate.

`threads` is what the figures are for (the host's threads a call uses); the model reads
`mem_gbps` and `tflops`, which are those threads' together. Presets name their sources in a
comment; `cpu` is of the order of the 2-core machine moejax is developed on, not a
calibration.
"""

from __future__ import annotations

import dataclasses

from moejax.timing.profiles import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    check_fields,
    measured_profile,
    read_json,
    with_overrides,
)


@dataclasses.dataclass(frozen=True)
class HostCPU:
    name: str
    mem_gbps: float  # memory bandwidth one call's threads reach together, GB/s (1e9 bytes)
    tflops: float  # matmul peak of those threads, TFLOP/s
    threads: int  # the threads one call runs on
    call_overhead_s: float  # fixed cost per call (dispatch to the threads and join)
    # Activations device->host, GB/s. None: the host link's rate (`hardware.link_gbps`).
    d2h_gbps: float | None = None

    def validate(self) -> None:
        check_fields(self, "host", _RULES, unset=("d2h_gbps",))  # (unset: the link's rate)

    def expert_s(self, tokens: int, params: int, nbytes: float) -> float:
        """One call: an expert of `params` parameters and `nbytes` bytes for `tokens` tokens
        (module docstring)."""
        return expert_time(tokens, params, nbytes, self.mem_gbps * 1e9, self.tflops * 1e12,
                           self.call_overhead_s)


def expert_time(tokens: int, params: int, nbytes: float, mem_bps: float, flops: float,
                overhead_s: float) -> float:
    """`overhead_s + max(nbytes / mem_bps, 2 * tokens * params / flops)`."""
    read = nbytes / mem_bps
    compute = 2.0 * tokens * params / flops
    return overhead_s + (read if read > compute else compute)


# Each field's type and range, checked by `HostCPU.validate` (errors name the field).
_RULES = {"mem_gbps": POSITIVE, "tflops": POSITIVE, "d2h_gbps": POSITIVE,
          "call_overhead_s": (NON_NEGATIVE[0], NON_NEGATIVE[1], "a finite number >= 0 (seconds)"),
          "threads": AT_LEAST_ONE}


PRESETS: dict[str, HostCPU] = {
    # A desktop: AMD Ryzen 9 7950X (16 cores, AMD's specification: 4.5 GHz base clock,
    # AVX-512, DDR5-5200 the highest memory speed supported, two channels). Memory: two 64-bit
    # channels at 5200 MT/s = 83.2 GB/s theoretical; 60 GB/s assumed sustained (72% of it,
    # the order a streaming read reaches on dual-channel DDR5 desktops; an assumption, not a
    # measurement). FLOPs: Zen 4 issues two 256-bit FMAs a cycle per core (AVX-512 runs as two
    # halves) = 32 float32 FLOP/cycle; 16 cores x 4.5 GHz x 32 = 2.3 TFLOP/s float32, the
    # precision a CPU kernel without AMX multiplies bfloat16 weights in. Call overhead: a
    # thread pool's dispatch and join, assumed 20 us (tens of microseconds; not measured).
    "desktop_ddr5": HostCPU("desktop_ddr5", mem_gbps=60.0, tflops=2.3, threads=16,
                            call_overhead_s=20e-6),
    # A server: two AMD EPYC 9654 (96 cores each, AMD's specification: 2.4 GHz base clock,
    # 12 channels of DDR5-4800 per socket). One call runs on one socket's cores over its own
    # memory (the expert's pages NUMA-local; a call spread over both sockets would cross the
    # socket link): 12 x 8 bytes x 4800 MT/s = 460.8 GB/s theoretical per socket, 345 GB/s
    # assumed sustained (75%; an assumption). FLOPs: Zen 4 as above, 96 cores x 2.4 GHz x 32
    # = 7.4 TFLOP/s float32 per socket. Call overhead: assumed 30 us (more threads to join).
    "server_ddr5": HostCPU("server_ddr5", mem_gbps=345.0, tflops=7.4, threads=96,
                           call_overhead_s=30e-6),
    # Of the order of the 2-core virtual machine moejax is developed on (numpy: a 200 MB sum
    # read 16 GB/s; a float32 2048^2 matmul ran 0.13 TFLOP/s), rounded down: not a
    # calibration (`python -m moejax.calibration` measures a machine). Call overhead:
    # assumed 50 us.
    "cpu": HostCPU("cpu", mem_gbps=15.0, tflops=0.1, threads=2, call_overhead_s=50e-6),
    # This machine (the 2-core VM moejax is developed on: "Intel(R) Xeon(R) Processor", 2
    # threads), measured 2026-12-01 with `python -m moejax.calibration --workdir=W
    # --host-only` (OLMoE-1B-7B's expert: hidden 2048 x width 1024, bfloat16, 12.58 MB; load
    # average ~3.5 from other work on the machine, so a quiet VM runs faster): one expert's
    # read 3.16 GB/s, a 512-token matmul 0.39 TFLOP/s, an empty jitted call 92 us. `this_vm`
    # is the model fitted to one expert computed by a plain jitted kernel (gate_up, SiLU, down)
    # for 1..64 tokens: 3.7 ms + max(b / 3.16 GB/s, 2 t P / 0.083 TFLOP/s), residual rms 16%
    # (the host a per-expert kernel sees; compare with the presets above).
    "this_vm": HostCPU("this_vm", mem_gbps=3.16, tflops=0.083, threads=2,
                       call_overhead_s=3.7e-3),
    # The same machine running moejax's live host step (`expert_outputs` over a 64-expert
    # host table, the tiled grouped matmul: it gathers one copy of the expert's weights per
    # row tile, so its time grows ~linearly from 1 token): 9.9 ms + max(b / 3.16 GB/s,
    # 2 t P / 0.00103 TFLOP/s), residual rms 3.8% (22 ms at 1 token, 820 ms at 64).
    "this_vm_live": HostCPU("this_vm_live", mem_gbps=3.16, tflops=0.00103, threads=2,
                            call_overhead_s=9.9e-3),
}

OVERRIDABLE = ("mem_gbps", "tflops", "threads", "call_overhead_s", "d2h_gbps")


FILE_FIELDS = ("name", *OVERRIDABLE)


def from_file(path: str, **overrides) -> HostCPU | None:
    """The profile in the `host` section of the hardware.json at `path` (`{"profile": <every
    field of HostCPU>, ...}`, written by `python -m moejax.calibration`), with `overrides`
    applied as `get` applies them to a preset (None keeps the file's value). None when the
    file has no `host` section. A missing, unreadable or non-JSON file, a section that is not
    a profile, a missing or unknown field and a value out of range are `ConfigError`s naming
    `hardware.file=path`."""
    where = f"hardware.file={path!r}"
    doc = read_json(path, where)
    if not isinstance(doc, dict) or "host" not in doc:
        return None
    section = doc["host"]
    return measured_profile(HostCPU, section.get("profile") if isinstance(section, dict)
                            else None, "host", FILE_FIELDS, overrides, OVERRIDABLE,
                            where, 'host section\'s "profile"')


def get(name: str, **overrides) -> HostCPU:
    """The preset `name` with `overrides` applied (None keeps the preset's value), validated
    (errors name the field)."""
    return with_overrides("host", PRESETS, name, overrides, OVERRIDABLE)
