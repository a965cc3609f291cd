"""Fits of measured times to the virtual clock's two models (numpy only, no measurement here).

* A host->device transfer takes `latency + bytes / bandwidth` (`moejax.timing.clock`): `fit_transfer`
  is a least-squares line through (bytes, seconds), each point weighted by 1 / its seconds, so
  the 4 KiB transfers (where the latency is) count as much as the 64 MiB ones (where the
  bandwidth is). An unweighted fit would leave the latency to the noise of the largest ones.
* A compiled step takes `max(FLOPs / peak, bytes / HBM bandwidth) + launch`
  (`moejax.timing.timeline.roofline`; the cost model's embedding and LM head are two steps, two
  launches): `fit_roofline` finds the three by least squares on log time (every step counts by
  its relative error), from a start at the best rates measured.

* A host expert call takes `overhead + max(bytes / memory bandwidth, 2 * tokens * params /
  FLOP/s)` (`moejax.timing.host`): `fit_host` finds the overhead and the FLOP/s by least squares
  on log time, the bandwidth given (measured apart: every call reads the same bytes, so the
  calls' times alone cannot tell the overhead from the time of the read).

All say how well the model fits (`rms_rel`, `max_rel`: the relative residuals of the points),
and which parameter the points did not determine (a roofline fitted to steps that were all
memory- or launch-bound cannot say the FLOP peak; the fit then keeps the highest rate measured,
a lower bound, and says so).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class TransferFit:
    latency_s: float  # fixed cost per transfer
    gbps: float  # bytes per second once moving, in GB/s (1e9 bytes)
    rms_rel: float  # root mean square of (fitted - measured) / measured over the points
    max_rel: float  # the largest |fitted - measured| / measured
    points: int

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes / (self.gbps * 1e9)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _points(xs, seconds, x_name: str, fit: str, distinct: str, times: str):
    """`(x, y)` as float64 arrays, checked: equal-length sequences, at least two distinct x,
    every time finite and > 0 (ValueError naming what is wrong)."""
    x = np.asarray(xs, np.float64)
    y = np.asarray(seconds, np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"{x_name} and seconds must be equal-length sequences")
    if len(np.unique(x)) < 2:
        raise ValueError(f"{fit} needs at least two distinct {distinct}")
    if not (np.all(np.isfinite(y)) and np.all(y > 0)):
        raise ValueError(f"{times} must be finite and > 0, got {y.tolist()}")
    return x, y


def fit_transfer(nbytes, seconds) -> TransferFit:
    """`latency + bytes / bandwidth` through the points `(nbytes[i], seconds[i])`, weighted by
    1 / seconds (relative errors). A negative latency (noise around a latency of ~0) is fitted
    again with the latency held at 0. Raises ValueError for fewer than two distinct sizes or a
    time that is not positive and finite."""
    x, y = _points(nbytes, seconds, "nbytes", "a transfer fit", "sizes", "transfer times")
    w = 1.0 / y
    a = np.stack([np.ones_like(x), x], 1) * w[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(a, y * w, rcond=None)
    if latency < 0:
        latency = 0.0
        per_byte = float(np.sum(w * w * x * y) / np.sum(w * w * x * x))
    if per_byte <= 0:
        raise ValueError("the transfer times do not grow with size: no bandwidth to fit")
    rel = (latency + per_byte * x - y) / y
    return TransferFit(float(latency), float(1.0 / per_byte / 1e9),
                       float(np.sqrt(np.mean(rel ** 2))), float(np.max(np.abs(rel))), len(x))


# The share of a step's time a roofline term must reach for the fit to say the step measured it.
SENSITIVE = 0.25


@dataclasses.dataclass(frozen=True)
class RooflineFit:
    peak_tflops: float
    hbm_gbps: float
    launch_s: float
    rms_rel: float  # as TransferFit's, over the steps
    max_rel: float
    points: int
    # Which of the three the steps' times depend on (`fit_roofline`): a roofline fitted to
    # steps that never reach the FLOP peak (all memory- or launch-bound) leaves it free
    # (`peak_tflops` is then the highest rate measured, a lower bound), and the same for the
    # bandwidth.
    determined: dict

    def seconds(self, flops: float, nbytes: float, launches: int = 1) -> float:
        return roofline_seconds(flops, nbytes, self.peak_tflops, self.hbm_gbps, self.launch_s,
                                launches)

    def bound(self, flops: float, nbytes: float) -> str:
        """Which side of the roofline a step of `flops` and `nbytes` is on."""
        compute = flops / (self.peak_tflops * 1e12)
        return "compute" if compute > nbytes / (self.hbm_gbps * 1e9) else "memory"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def roofline_seconds(flops, nbytes, peak_tflops: float, hbm_gbps: float, launch_s: float,
                     launches=1):
    """`timeline.roofline` with the profile's units, `launches` launches (works on arrays)."""
    return (np.maximum(np.asarray(flops) / (peak_tflops * 1e12),
                       np.asarray(nbytes) / (hbm_gbps * 1e9))
            + np.asarray(launches) * launch_s)


def fit_roofline(flops, nbytes, seconds, launches=None) -> RooflineFit:
    """`max(flops / peak, bytes / bandwidth) + launches * launch` through the steps measured
    (`flops[i]`, `nbytes[i]`, `seconds[i]`, `launches[i]`: 1 each when not given), by least
    squares on log time. Raises ValueError for fewer than three steps or a time that is not
    positive and finite."""
    f = np.asarray(flops, np.float64)
    b = np.asarray(nbytes, np.float64)
    t = np.asarray(seconds, np.float64)
    n = np.ones_like(t) if launches is None else np.asarray(launches, np.float64)
    if not (f.shape == b.shape == t.shape == n.shape) or f.ndim != 1:
        raise ValueError("flops, nbytes, seconds (and launches) must be equal-length sequences")
    if len(t) < 3:
        raise ValueError("a roofline fit needs at least three steps")
    if not (np.all(np.isfinite(t)) and np.all(t > 0)):
        raise ValueError(f"step times must be finite and > 0, got {t.tolist()}")
    log_t = np.log(t)

    def loss(p):
        # p: log of (1 / FLOP/s, 1 / byte/s, launch seconds)
        a, c, launch = np.exp(p)
        return float(np.sum((np.log(np.maximum(f * a, b * c) + n * launch) - log_t) ** 2))

    # Start: the launch a fraction of the fastest step, the rates the best any step showed
    # with that launch taken off.
    best = None
    for share in (0.1, 0.5, 0.9):
        launch0 = share * np.min(t / n)
        rest = np.maximum(t - n * launch0, 1e-12)
        p0 = np.log([1.0 / max(np.max(f / rest), 1.0), 1.0 / max(np.max(b / rest), 1.0),
                     launch0])
        p = _nelder_mead(loss, p0)
        if best is None or loss(p) < loss(best):
            best = p
    a, c, launch = np.exp(best)
    peak, bw = 1.0 / a, 1.0 / c
    # A parameter the steps' times do not depend on is not determined by the fit (it could be
    # anything beyond some value): a side of the roofline is determined when it is at least
    # SENSITIVE of some step's time, the launch when its launches are. An undetermined rate is
    # replaced by the best the steps showed, their launches taken off (but at least SENSITIVE
    # of each step's time left, so a launch-bound step cannot make it boundless): a lower
    # bound of the rate (a step's work took at most that time), and no step's term under it
    # takes more than its time without its launches.
    compute_term, memory_term = f * a, b * c
    on_compute = compute_term > memory_term
    determined = {
        "peak_tflops": bool(np.any(on_compute & (compute_term >= SENSITIVE * t))),
        "hbm_gbps": bool(np.any(~on_compute & (memory_term >= SENSITIVE * t))),
        "launch_s": bool(np.any(n * launch >= SENSITIVE * t))}
    work_s = np.maximum(t - n * launch, SENSITIVE * t)
    if not determined["peak_tflops"]:
        peak = float(np.max(f / work_s))
    if not determined["hbm_gbps"]:
        bw = float(np.max(b / work_s))
    fitted = roofline_seconds(f, b, peak / 1e12, bw / 1e9, launch, n)
    rel = (fitted - t) / t
    return RooflineFit(float(peak / 1e12), float(bw / 1e9), float(launch),
                       float(np.sqrt(np.mean(rel ** 2))), float(np.max(np.abs(rel))), len(t),
                       determined)


@dataclasses.dataclass(frozen=True)
class HostFit:
    mem_gbps: float  # given (measured apart)
    tflops: float
    call_overhead_s: float
    rms_rel: float  # as TransferFit's, over the calls
    max_rel: float
    points: int
    # Whether the calls reached the FLOP side (`fit_host`); when not, `tflops` is the best rate
    # a call showed, a lower bound.
    determined: dict

    def seconds(self, tokens, params: int, nbytes: float):
        return host_seconds(tokens, params, nbytes, self.mem_gbps, self.tflops,
                            self.call_overhead_s)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def host_seconds(tokens, params: int, nbytes: float, mem_gbps: float, tflops: float,
                 overhead_s: float):
    """`moejax.timing.host.expert_time` with the profile's units (works on arrays)."""
    return overhead_s + np.maximum(nbytes / (mem_gbps * 1e9),
                                   2.0 * np.asarray(tokens, np.float64) * params / (tflops * 1e12))


def fit_host(tokens, seconds, params: int, nbytes: float, mem_gbps: float) -> HostFit:
    """`overhead + max(nbytes / mem_bw, 2 * tokens * params / flops)` through the calls
    (`tokens[i]`, `seconds[i]`) of one expert of `params` parameters and `nbytes` bytes, the
    memory bandwidth `mem_gbps` given: the overhead (>= 0) and the FLOP/s by least squares on
    log time. The FLOP/s is determined when some call's compute term is on top and at least
    SENSITIVE of its time; otherwise it is the best rate a call showed (its overhead taken
    off, at least SENSITIVE of its time left), a lower bound. Raises ValueError for fewer
    than two distinct token counts or a time that is not positive and finite."""
    t, y = _points(tokens, seconds, "tokens", "a host fit", "token counts", "call times")
    if not (mem_gbps > 0 and math.isfinite(mem_gbps)):
        raise ValueError(f"mem_gbps={mem_gbps} must be finite and > 0")
    read = nbytes / (mem_gbps * 1e9)
    work = 2.0 * t * params
    log_y = np.log(y)

    def loss(p):  # p: log of (seconds per FLOP, overhead seconds)
        per_flop, overhead = np.exp(p)
        return float(np.sum((np.log(overhead + np.maximum(read, work * per_flop)) - log_y)
                            ** 2))

    best = None
    # Starts: the overhead a share of the fastest call, the FLOP rate the best any call showed
    # with it, or the largest call's (the one most on the FLOP side: where only it passes the
    # ridge, the loss is nearly flat elsewhere and the simplex would stop short of it).
    largest = int(np.argmax(t))
    for share in (0.01, 0.3, 0.9):
        overhead0 = share * np.min(y)
        rest = np.maximum(y - overhead0, 1e-12)
        for per_flop0 in (1.0 / max(np.max(work / rest), 1.0), rest[largest] / work[largest]):
            p = _nelder_mead(loss, np.log([per_flop0, overhead0]))
            if best is None or loss(p) < loss(best):
                best = p
    per_flop, overhead = np.exp(best)
    compute = work * per_flop
    determined = {"tflops": bool(np.any((compute > read) & (compute >= SENSITIVE * y)))}
    flops = 1.0 / per_flop
    if not determined["tflops"]:
        flops = float(np.max(work / np.maximum(y - overhead, SENSITIVE * y)))
    fitted = host_seconds(t, params, nbytes, mem_gbps, flops / 1e12, overhead)
    rel = (fitted - y) / y
    return HostFit(float(mem_gbps), float(flops / 1e12), float(overhead),
                   float(np.sqrt(np.mean(rel ** 2))), float(np.max(np.abs(rel))), len(t),
                   determined)


def _nelder_mead(loss, p0, iterations: int = 4000, tol: float = 1e-12) -> np.ndarray:
    """The simplex minimiser (numpy only; deterministic), started from `p0` with steps of a
    factor e^0.5 in each log parameter."""
    n = len(p0)
    simplex = [np.asarray(p0, np.float64)]
    for i in range(n):
        p = np.array(p0, np.float64)
        p[i] += 0.5
        simplex.append(p)
    values = [loss(p) for p in simplex]
    for _ in range(iterations):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) <= tol * (abs(values[0]) + tol):
            break
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        reflected = centroid + (centroid - worst)
        r = loss(reflected)
        if values[0] <= r < values[-2]:
            simplex[-1], values[-1] = reflected, r
            continue
        if r < values[0]:
            expanded = centroid + 2.0 * (centroid - worst)
            e = loss(expanded)
            simplex[-1], values[-1] = (expanded, e) if e < r else (reflected, r)
            continue
        contracted = centroid + 0.5 * (worst - centroid)
        c = loss(contracted)
        if c < values[-1]:
            simplex[-1], values[-1] = contracted, c
            continue
        for i in range(1, len(simplex)):  # shrink towards the best
            simplex[i] = simplex[0] + 0.5 * (simplex[i] - simplex[0])
            values[i] = loss(simplex[i])
    return simplex[int(np.argmin(values))]


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured, None when either is missing or measured is 0."""
    if predicted is None or measured is None or measured == 0 or math.isnan(measured):
        return None
    return (predicted - measured) / measured


# -- the host's work: scalar terms from live passes ------------------------------------------
@dataclasses.dataclass(frozen=True)
class TermsFit:
    """Non-negative seconds per charge of each term, fitted to live passes (`fit_terms`)."""

    terms: dict[str, float]
    rms_rel: float  # root mean square of (fitted - measured) / measured over the passes
    max_rel: float
    points: int
    # Whether the data tells each term apart: a term no pass charged (held at 0), or one whose
    # charges are a combination of the others' (every pass charges a round trip or a check
    # per layer, so a pass's own cost can move into them), is not determined: its value is one
    # of many that fit as well.
    determined: dict[str, bool]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def nnls(a: np.ndarray, b: np.ndarray, iterations: int = 200) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    n = a.shape[1]
    x = np.zeros(n)
    free = np.zeros(n, bool)  # the passive set: terms allowed above 0
    for _ in range(iterations):
        gradient = a.T @ (b - a @ x)
        candidates = np.where(~free & (gradient > 1e-12 * max(1.0, np.abs(gradient).max())))[0]
        if not len(candidates):
            break
        free[candidates[np.argmax(gradient[candidates])]] = True
        while True:
            z = np.zeros(n)
            z[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
            if np.all(z[free] > 0):
                x = z
                break
            # step back toward x until a term of the passive set hits 0, and drop it
            blocked = free & (z <= 0)
            alpha = np.min(x[blocked] / (x[blocked] - z[blocked]))
            x = x + alpha * (z - x)
            free &= x > 1e-15
            x[~free] = 0.0
    return x


def fit_terms(names, counts, rest, measured) -> TermsFit:
    """Seconds per charge `c_k >= 0` of each term in `names` such that each pass's
    `measured_i ~ rest_i + sum_k counts[i][k] * c_k` (`rest`: what the model charges besides
    these terms), by least squares weighted by 1 / measured (relative errors). A term with no
    charge in any pass is not determined (0)."""
    x = np.asarray(counts, np.float64)
    rest = np.asarray(rest, np.float64)
    y = np.asarray(measured, np.float64)
    if x.ndim != 2 or x.shape != (len(y), len(names)) or rest.shape != y.shape:
        raise ValueError("counts must be [passes, terms], rest and measured [passes]")
    if not (np.all(np.isfinite(y)) and np.all(y > 0)):
        raise ValueError("measured pass times must be finite and > 0")
    w = 1.0 / y
    c = nnls(x * w[:, None], (y - rest) * w)
    rel = (rest + x @ c - y) / y
    a = x * w[:, None]
    rank = _rank(a)
    determined = {k: bool(np.any(x[:, j])) and _rank(np.delete(a, j, axis=1)) < rank
                  for j, k in enumerate(names)}
    return TermsFit({k: float(v) for k, v in zip(names, c)}, float(np.sqrt(np.mean(rel ** 2))),
                    float(np.max(np.abs(rel))), len(y), determined)


def _rank(a: np.ndarray) -> int:
    if a.size == 0:
        return 0
    s = np.linalg.svd(a / np.maximum(np.abs(a).max(axis=0), 1e-300), compute_uv=False)
    return int(np.sum(s > 1e-9 * s[0])) if len(s) and s[0] > 0 else 0
