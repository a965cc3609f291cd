"""Every number a job prints says what it is (issue 23): each speed names its clock (the cache's
modelled virtual clock, or this machine's wall clock), each capacity percentage what it is a
share of, a missing TTFT why; every job ends with `results -> W/results.json`; a replay's
requests per second leave out the compiled kernel's one-time load (`replay.setup_s`); a text
file that is not text is refused before anything is written."""

from __future__ import annotations

import contextlib
import json
import os
import time
import types

import pytest

from moejax import bundled, jobs
from moejax.cache import summary
from moejax.cache.metrics import CacheMetrics
from moejax.errors import ConfigError
from moejax.jobs import common, generate, perplexity, quality
from moejax.jobs import replay as replay_job
from moejax.jobs.schema import base_config
from moejax.replay import compiled
from moejax.replay import kernel as K

# A preset models the device alone: every virtual time says the host work is not in it.
VIRTUAL = "virtual clock (modelled a100_specmd, 5 GB/s host->device; host work not modelled)"
WALL = "wall clock (this machine)"


def _last_line(out: str) -> str:
    return out.rstrip("\n").splitlines()[-1]


def _quiet(c):
    c.log.progress = False
    c.log.tensorboard = False
    return c


# -- generate: both clocks, the capacity's two percentages, the results path -------------------


def test_generate_names_each_clock_and_what_each_share_is_of(tmp_path, capsys):
    c = _quiet(base_config())  # the embedded model, its experts at int4 through the cache
    c.run.prompts = ("The Python interpreter", "def main():")
    c.run.max_new_tokens, c.run.warmup = 4, False
    c.cache.precision = "int4"
    work = tmp_path / "w"
    res = jobs.run(c, str(work))
    out = capsys.readouterr().out
    assert "Traceback" not in out
    slots, total = res["cache"]["slots"], 8 * 32
    # The slots as a share of the experts, the request as a share of the bytes, and why the
    # two differ (an int4 expert is smaller than a native one).
    assert (f"{slots}/{total} expert slots at int4 = {100 * slots / total:.1f}% of the experts "
            "(requested 5% of the routed experts' native bytes; an int4 expert is 0.") in out
    # The table's timing line is on the cache's modelled clock; the final line has the host's
    # wall clock, and the cache clock's TTFT of both requests beside it, each named.
    cc = res["timings"]["cache_clock"]
    assert f"{VIRTUAL}: TTFT {cc['cold_ttft_s'] * 1e3:.3f} ms cold" in out
    final = [line for line in out.splitlines() if line.startswith("[olmoe from")]
    assert len(final) == 1, out
    t = res["timings"]
    assert (f"2 requests, 8 tokens; {WALL}: TTFT cold {t['cold_ttft_s'] * 1e3:.1f} ms, warm "
            f"{t['warm_ttft_s'] * 1e3:.1f} ms, decode ") in final[0]
    assert f"; {VIRTUAL}: TTFT cold {cc['cold_ttft_s'] * 1e3:.3f} ms" in final[0]
    assert _last_line(out) == f"results -> {work / 'results.json'}"


def test_a_single_requests_line_names_the_wall_clock():
    results = {"timings": {"ttft_s": 0.012}, "requests": [
        {"generated_token_ids": [1, 2, 3, 4, 5], "decode_s": 0.08}]}
    line = generate.summary_line("olmoe", "SRC", results, VIRTUAL)
    assert line == f"[olmoe from SRC] 5 tokens; {WALL}: TTFT 12.0 ms, decode 50.0 tok/s"
    one = {"timings": {"ttft_s": 0.012}, "requests": [{"generated_token_ids": [1],
                                                       "decode_s": 0.0}]}
    assert "decode n/a (one token: it came from prefill)" in generate.summary_line(
        "olmoe", "SRC", one, None)


def test_the_table_names_its_clock_and_why_a_time_is_missing():
    m = CacheMetrics([0, 1])  # nothing ran: no prefill pass, no decode pass
    text = summary.table(m, "header", clock=VIRTUAL)
    assert (f"{VIRTUAL}: TTFT n/a (no prefill pass ran), decode n/a (no decode pass ran), "
            "stall") in text
    text = summary.table(m, "header", clock=VIRTUAL, no_ttft="the trace has none")
    assert "TTFT n/a (the trace has none)" in text
    wall = summary.clock_words("wall", "h200", 40.0)
    assert wall == "wall clock (this machine, transfers held to h200's 40 GB/s host->device)"


# -- replay: the engine's own rate, the kernel's load apart -------------------------------------


def _replay_config(progress: bool = False):
    c = _quiet(base_config())
    c.job, c.model.preset, c.clock.kind = "replay", "", "virtual"
    c.replay.trace = bundled.capture_path("olmoe_code")  # 512 decode steps, no prefill
    c.model.family, c.model.preset = "olmoe", "olmoe-1b-7b"
    c.cache.capacity_frac = 0.05
    c.policies.eviction, c.policies.prefetch = "lru", "none"
    c.log.progress = progress
    return c


def test_replay_rate_leaves_the_kernel_load_out(tmp_path, capsys, monkeypatch):
    """The kernel's load is timed apart: a load that takes LOAD seconds longer on the job's
    clock (the clock jumps inside it; nothing sleeps) shows in `setup_s` and not in `seconds`
    or `requests_per_s`, and the printed line says both."""
    LOAD = 1000.0
    jump = [0.0]
    real_clock, real_load = time.perf_counter, compiled.load_kernel

    def clock():
        return real_clock() + jump[0]

    def slow_load(args, kernel=None):
        t0 = clock()
        jump[0] += LOAD
        real_load(args, kernel)
        return clock() - t0

    # The replay job's clock, which times the replay and its load phase (`KernelPhase`).
    monkeypatch.setattr(replay_job, "time", types.SimpleNamespace(perf_counter=clock))
    monkeypatch.setattr(compiled, "load_kernel", slow_load)
    work = tmp_path / "w"
    start = real_clock()
    res = jobs.run(_replay_config(progress=True), str(work))
    span = real_clock() - start  # the whole job on the real clock, without the jump
    r, requests = res["replay"], res["cache"]["total"]["requests"]
    assert r["engine"] == "compiled", r["engine_reason"]
    assert r["setup_s"] >= LOAD, r
    # Had the load been counted in the replay's own time, `seconds` would hold the jump and
    # exceed the whole job's real span by LOAD.
    assert 0 < r["seconds"] <= span, (r, span)
    assert r["requests_per_s"] == pytest.approx(requests / r["seconds"])
    assert r["requests_per_s"] > requests / (r["seconds"] + r["setup_s"])
    with open(work / "results.json") as f:
        assert json.load(f)["replay"] == r
    out = capsys.readouterr().out
    assert (f"{VIRTUAL}: TTFT n/a (the trace has no prefill pass, only decode steps: "
            "--config.replay.request_tokens=N --config.replay.prefill_tokens=M") in out
    assert (f"{WALL}: {requests:,} cache requests replayed in {r['seconds']:.3f} s on the "
            f"compiled engine ({r['requests_per_s']:,.0f} requests/s), after "
            f"{r['setup_s']:.2f} s loading its kernel (once per process)") in out
    assert _last_line(out) == f"results -> {work / 'results.json'}"


@pytest.mark.parametrize("prefetch", ["none", "temporal"])
def test_the_kernel_loads_once_for_the_types_it_is_called_with(tmp_path, monkeypatch, prefetch):
    """`load_kernel` makes the very overload the run then calls (no second compile at the
    call), so the run's own time holds no load; a second replay in the process finds the
    kernel already loaded: no compile and no read of numba's disk cache. The kernel is the one
    the run takes: the lean kernel `kernel_for` hands a run without prefetch, the general one
    (`kernel.run`) a prefetching one. (Other tests in the process may have loaded either for
    other argument types: the counts are taken before.)"""
    handed = []
    real_kernel_for = compiled.lean_kernel.kernel_for

    def spy(*args):
        handed.append(real_kernel_for(*args))
        return handed[-1]
    monkeypatch.setattr(compiled.lean_kernel, "kernel_for", spy)
    config = _replay_config()
    config.policies.prefetch = prefetch
    kernels = [K.run, *compiled.lean_kernel.KERNELS.values()]
    overloads = {id(k): len(k.overloads) for k in kernels}
    stats = {id(k): (sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))
             for k in kernels}
    first = jobs.run(config, str(tmp_path / "a"))["replay"]
    assert first["engine"] == "compiled", first
    kernel = handed[0] if prefetch == "none" else K.run
    assert len(handed) == (1 if prefetch == "none" else 0)
    # One load of the one kernel the run took: at most one overload and one compile or disk
    # read more than before, and none of any other kernel.
    for k in kernels:
        now_stats = (sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))
        if k is kernel:
            assert len(k.overloads) - overloads[id(k)] in (0, 1)
            assert sum(now_stats) - sum(stats[id(k)]) == len(k.overloads) - overloads[id(k)]
            assert len(k.overloads) >= 1
        else:
            assert (len(k.overloads), now_stats) == (overloads[id(k)], stats[id(k)])
    held, counted = len(kernel.overloads), (sum(kernel.stats.cache_hits.values()),
                                            sum(kernel.stats.cache_misses.values()))
    second = jobs.run(config, str(tmp_path / "b"))["replay"]
    assert second["engine"] == "compiled" and second["setup"] == compiled.IN_PROCESS, second
    assert len(kernel.overloads) == held
    assert (sum(kernel.stats.cache_hits.values()),
            sum(kernel.stats.cache_misses.values())) == counted
    reference = _replay_config()
    reference.replay.engine = "reference"
    ref = jobs.run(reference, str(tmp_path / "c"))["replay"]
    assert ref["engine"] == "reference" and ref["setup_s"] == 0.0


# -- perplexity: a progress bar, the cache's table, the clocks ----------------------------------


class _Bar:
    def __init__(self):
        self.done = 0

    def update(self, n: int) -> None:
        self.done += n


def test_perplexity_shows_progress_and_the_cache_table(tmp_path, capsys, monkeypatch):
    bars = []

    @contextlib.contextmanager
    def recording(enabled, total, desc, unit="tok"):
        bars.append((desc, total, _Bar()))
        yield bars[-1][2]

    monkeypatch.setattr(perplexity, "progress", recording)
    text = tmp_path / "text.txt"
    text.write_text("Bits per byte of a random model are close to eight.\n" * 2)
    c = _quiet(base_config())
    c.job, c.model.preset, c.model.family = "perplexity", "tiny", "olmoe"
    c.cache.capacity_frac = 0.25
    c.perplexity.text_file = str(text)
    c.perplexity.window, c.perplexity.stride = 64, 32
    work = tmp_path / "w"
    res = jobs.run(c, str(work))
    out = capsys.readouterr().out
    assert [(desc, total) for desc, total, _ in bars] == [("perplexity", res["tokens_scored"])]
    assert bars[0][2].done == res["tokens_scored"]  # every scored token moved the bar
    assert "expert slots at native = " in out and "(requested 25% of the routed" in out
    assert f"{VIRTUAL}: TTFT " in out  # the cache's table, as generate prints it
    assert f"{res['bits_per_byte']:.4f} bits/byte" in out and f"; {WALL}: scored in" in out
    assert _last_line(out) == f"results -> {work / 'results.json'}"


# -- a text file that is not text -----------------------------------------------------------


def test_random_bytes_are_refused_by_name_and_share_before_anything_is_written(tmp_path):
    noise = tmp_path / "noise.txt"
    # Of each 256: the 128 bytes >= 0x80 (none valid UTF-8 in this order) and 28 control
    # characters, 60.9%.
    noise.write_bytes(bytes(range(256)) * 8)
    c = base_config()
    c.job, c.perplexity.text_file = "perplexity", str(noise)
    work = tmp_path / "w"
    with pytest.raises(ConfigError) as e:
        jobs.run(c, str(work))
    message = str(e.value)
    assert f"perplexity.text_file={str(noise)!r}" in message and "60.9% of its 2048 bytes are not text" \
        in message and "above the 10%" in message, message
    assert not work.exists()
    q = base_config()
    q.job, q.quality.text_file = "quality", str(noise)
    with pytest.raises(ConfigError, match="^quality.text_file=.*60.9% of its 2048 bytes are "
                                          "not text"):
        quality.validate(q)


def test_a_little_non_text_is_a_warning_and_text_is_silent(tmp_path, capsys):
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("Café au lait in Zürich, naïvely.\n".encode("latin-1") * 4)
    clean = tmp_path / "clean.txt"
    clean.write_text("Café au lait in Zürich, naïvely.\n\tand a tab\r\n")
    common.check_text_file(str(clean), "perplexity.text_file")
    assert capsys.readouterr().err == ""
    common.check_text_file(str(latin), "perplexity.text_file")
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ": warning: " in ln]
    assert len(warnings) == 1
    assert f"perplexity.text_file={str(latin)!r}: 9.1% of its 132 bytes are not text" in warnings[0]
    assert common.not_text_share("a\x85b\x00".encode()) == pytest.approx(3 / 5)


# -- quality and record_traces ------------------------------------------------------------------


def _quality_results(ttft):
    q = {"teacher_forcing": "decode", "tokens": 10, "kl_mean": 0.0, "kl_p50": 0.0, "kl_p99": 0.0,
         "kl_max": 0.0, "top1_agreement": 1.0, "bits_per_byte": 3.0,
         "reference_bits_per_byte": 3.0, "bits_per_byte_delta": 0.0,
         "drift": {"prompts": 0}}
    return {"model": {"source": "SRC", "precision": "native"}, "quality": q,
            "speed": {"ttft_s": ttft, "decode_tok_per_s": 900.0, "stall_s": 0.001,
                      "clock": "virtual"},
            "cache": {"hardware": {"name": "a100_specmd", "h2d_gbps": 5.0},
                      "host_work": {"modelled": False, "words": "host work not modelled"}}}


def test_quality_speed_names_its_clock():
    text = quality.describe(_quality_results(0.002))
    assert (f"speed on the {VIRTUAL}, drift requests: TTFT 2.000 ms, decode 900.0 tok/s, "
            "stall 1.000 ms") in text
    assert (f"speed on the {VIRTUAL}: n/a (no drift request ran: quality.drift_prompts=0)"
            in quality.describe(_quality_results(None)))


def test_record_traces_says_where_its_results_went(tmp_path, capsys):
    c = _quiet(base_config())
    c.job, c.model.family, c.model.preset = "record_traces", "mixtral", "tiny"
    c.tracing.prompts_per_domain, c.tracing.prompt_tokens = 1, 8
    c.run.max_new_tokens = 2
    work = tmp_path / "rec"
    jobs.run(c, str(work))
    out = capsys.readouterr().out
    assert f"{os.path.join(work, 'prose.npz')}: prose, 10 tokens, bits/byte " in out
    assert _last_line(out) == f"results -> {work / 'results.json'}"
