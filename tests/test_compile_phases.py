"""A compile is a phase of its own, never inside a rate (issue 39).

Perplexity runs each window length once, untimed and unscored, on a throwaway cache, before it
times the scored pass: its tokens per second are the scored pass's tokens over the scored pass's
time, the compile phase has its own field and line, and jax's own events say how many
executables were built inside the scored pass (none, when the phase met every shape). The
replay job says the compiled kernel's load as a line of its own, and what it was (a numba
compile, once per machine, or a read from numba's disk cache), from numba's own counters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax import bundled, jobs
from moejax.jobs.cache_report import settle
from moejax.jobs.common import cache_of, configured_decoder, xla_compiles
from moejax.jobs.perplexity import score
from moejax.jobs.replay import run_line
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.model_source import load_model_for
from moejax.replay import compiled

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WALL = "wall clock (this machine)"
# 3 x 52 bytes (the tiny model's tokenizer is bytes): 156 tokens, 155 scored. Windows of 37
# (a length no other test compiles, so the scored pass would build executables of its own
# were the compile phase gone), stride 18: starts 0, 18, ..., 108 and the last one at 119.
TEXT = "A tiny text, scored in windows of 37 bytes at most.\n" * 3
WINDOW, STRIDE = 37, 18


def _perplexity_config(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    c = base_config()
    c.job, c.model.preset, c.model.family = "perplexity", "tiny", "olmoe"
    c.log.progress, c.log.tensorboard = False, False
    c.cache.capacity_frac = 0.25
    c.perplexity.text_file = str(text)
    c.perplexity.window, c.perplexity.stride = WINDOW, STRIDE
    return c


def test_xla_compiles_counts_an_executable_built_and_none_for_a_cached_call():
    x = jnp.arange(11.0)
    x.block_until_ready()
    f = jax.jit(lambda v: jnp.cumsum(v * 3.0) - 2.0)  # a new function: never compiled before
    with xla_compiles() as first:
        f(x).block_until_ready()
    with xla_compiles() as again:
        f(x).block_until_ready()
    assert (first.count, again.count) == (1, 0)


def test_perplexity_rates_the_scored_pass_and_reports_the_compile_phase_apart(tmp_path,
                                                                              capsys):
    work = tmp_path / "w"
    res = jobs.run(_perplexity_config(tmp_path), str(work))
    out = capsys.readouterr().out.splitlines()
    assert res["tokens_scored"] == len(TEXT.encode()) - 1 == 155
    t = res["timings"]
    assert t["clock"] == "wall" and "eval_s" not in res
    # The compile phase met every shape the scored pass ran: no executable built inside it.
    assert (t["xla_compiles_in_score"], t["xla_compile_in_score_s"]) == (0, 0.0)
    # The rate is the scored pass's own: its tokens over its time, the compile phase apart.
    assert t["tokens_per_s"] == pytest.approx(155 / t["score_s"])
    with open(work / "results.json") as f:
        assert json.load(f)["timings"] == t
    # The compile phase's line, before the score's line, which names both phases.
    phase = (f"perplexity: compiling its steps (one untimed, unscored window of {WINDOW} "
             f"tokens on a throwaway cache) ... done in {t['compile_s']:.1f} s, {WALL}")
    final = [i for i, line in enumerate(out) if line.startswith(f"{tmp_path / 'text.txt'}: ")]
    assert phase in out and len(final) == 1 and out.index(phase) < final[0], out
    assert out[final[0]].endswith(
        f"; {WALL}: scored in {t['score_s']:.2f} s (155 tokens, {t['tokens_per_s']:.1f} tok/s; "
        f"no XLA compile inside), after {t['compile_s']:.1f} s compiling (untimed, apart)")


def test_the_compile_phase_leaves_the_scored_cache_alone(tmp_path):
    """The compile phase runs on a throwaway cache: the job's cache counts exactly what the
    same scoring on a fresh cache, with no compile phase, counts."""
    c = _perplexity_config(tmp_path)
    res = jobs.run(c, str(tmp_path / "w"))
    loaded = load_model_for(resolve(c))
    ids = np.asarray(loaded.tokenizer.encode(TEXT), np.int32)
    experts, decoder = configured_decoder(resolve(c), loaded, max_len=WINDOW)
    score(decoder, ids, WINDOW, STRIDE)
    cache = settle(cache_of(experts))
    cache.finish()
    plain = cache.metrics.totals()
    for k in ("requests", "hits", "late_hits", "misses", "prefetch_issued"):
        assert res["cache"]["total"][k] == plain[k], k


# -- replay: the compiled kernel's load, a phase of its own -----------------------------------


def _replay_config():
    c = base_config()
    c.job, c.model.preset, c.clock.kind = "replay", "", "virtual"
    c.replay.trace = bundled.capture_path("olmoe_code")  # 512 decode steps
    c.model.family, c.model.preset = "olmoe", "olmoe-1b-7b"
    c.cache.capacity_frac = 0.05
    c.policies.eviction, c.policies.prefetch = "lru", "none"
    c.log.progress, c.log.tensorboard = False, False
    return c


LOADING = ("replay engine: loading its numba kernel (compiled once per machine, then read from "
           "numba's disk cache) ... ")


def _load_line(r: dict) -> str:
    what = "compiled" if r["setup"] == compiled.COMPILED else "read from numba's disk cache"
    return (f"{LOADING}{what} in {r['setup_s']:.2f} s, {WALL}; apart from the replay's time")


def test_a_kernel_this_process_holds_has_no_load_phase(tmp_path, capsys):
    """A replay's kernel load is said as a line of its own exactly when there is one to say: a
    second replay in the process finds the kernel loaded, and says nothing of it."""
    for name in ("a", "b"):
        r = jobs.run(_replay_config(), str(tmp_path / name))["replay"]
        out = capsys.readouterr().out.splitlines()
        assert r["engine"] == "compiled", r["engine_reason"]
        assert r["setup"] in (compiled.COMPILED, compiled.DISK_CACHE, compiled.IN_PROCESS)
        said = [line for line in out if line.startswith(LOADING)]
        assert said == ([] if r["setup"] == compiled.IN_PROCESS else [_load_line(r)]), out
    assert r["setup"] == compiled.IN_PROCESS  # the second


# A numba kernel of its own (compiling the replay kernel from an empty cache takes ~40 s):
# `compiled.load` reads how numba made any `cache=True` dispatcher callable.
_KERNEL = """import numba


@numba.njit(cache=True)
def twice(x):
    return 2 * x
"""
_LOAD = ("import numpy as np, tiny_kernel\n"
         "from moejax.replay import compiled\n"
         "print(compiled.load((np.int64(3),), tiny_kernel.twice).how)\n"
         "print(compiled.load((np.int64(3),), tiny_kernel.twice).how)\n")


def test_a_first_load_on_a_machine_is_a_compile_and_the_next_process_reads_the_cache(tmp_path):
    """In a numba cache directory of its own (a machine that never ran the kernel), the first
    process compiles it and a second call there finds it loaded; the next process reads it
    from numba's disk cache."""
    (tmp_path / "tiny_kernel.py").write_text(_KERNEL)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    seen = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _LOAD], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        seen.append(done.stdout.splitlines())
    assert seen == [[compiled.COMPILED, compiled.IN_PROCESS],
                    [compiled.DISK_CACHE, compiled.IN_PROCESS]]


@pytest.mark.parametrize("how, suffix", [
    (compiled.COMPILED, ": numba compiled it (once per machine)"),
    (compiled.DISK_CACHE, ": read from numba's disk cache"), (compiled.IN_PROCESS, "")])
def test_the_replay_line_says_what_the_kernel_load_was(how, suffix):
    r = {"seconds": 0.25, "setup_s": 1.5, "setup": how, "requests_per_s": 400.0,
         "engine": "compiled"}
    line = run_line(r, 100)
    assert line.endswith(f"after 1.50 s loading its kernel (once per process){suffix}"), line


@pytest.mark.parametrize("warmup", [True, False])
def test_generate_says_its_compile_phase_and_keeps_its_time_apart(tmp_path, capsys, warmup):
    c = base_config()
    c.model.preset, c.model.family = "tiny", "olmoe"
    c.log.progress, c.log.tensorboard = False, False
    c.run.max_new_tokens, c.run.warmup, c.cache.capacity_frac = 3, warmup, 0.25
    res = jobs.run(c, str(tmp_path / "w"))
    out = capsys.readouterr().out.splitlines()
    compile_s = res["timings"]["compile_s"]
    phases = [line for line in out if line.startswith("generate: compiling its steps")]
    if warmup:
        assert compile_s > 0 and phases == [
            "generate: compiling its steps (each prompt length's prefill and a decode step, "
            f"untimed, on a throwaway cache) ... done in {compile_s:.1f} s, {WALL}"], out
    else:  # the compiles fall inside the timed request: no phase, no figure for it
        assert compile_s is None and phases == [], out
