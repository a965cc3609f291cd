"""Several prompts in one generate run (`run.prompts`): one request each, through the same
expert cache, each a fresh sequence; TTFT per request, cold and warm."""

from __future__ import annotations

import glob
import json
import os
import re

import pytest
from absl import flags
from ml_collections import config_flags

from moejax import jobs
from moejax.errors import ConfigError
from moejax.jobs import generate
from moejax.jobs.schema import base_config
from moejax.model_source import embedded_config
from moejax.models import stepped

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = ("The Python interpreter", "def main():")  # two prompt lengths: 22 and 11 bytes
NEW = 6  # as tests/test_main.py: the first prompt's steps compile once for both


def _config(**run):
    c = base_config()  # the embedded model
    c.run.max_new_tokens = NEW
    c.run.warmup = False
    c.log.progress = False
    c.log.tensorboard = False
    c.cache.capacity_frac = 0.25
    for k, v in run.items():
        setattr(c.run, k, v)
    return c


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """Each prompt of PROMPTS run alone (the single-prompt job, `run.prompt`)."""
    out = {}
    for i, p in enumerate(PROMPTS):
        work = tmp_path_factory.mktemp(f"single{i}")
        out[p] = jobs.run(_config(prompt=p), str(work))["generated_token_ids"]
    return out


def _jit_entries() -> dict[str, int]:
    steps = ("attention_router_step", "experts_step", "dense_layer_step", "embed_step",
             "logits_step", "logits_next_step")
    return {name: getattr(stepped, name)._cache_size() for name in steps}


def test_requests_match_single_prompt_runs(single, tmp_path, monkeypatch):
    """Each request generates what a run of its prompt alone does (the cache is invisible to
    outputs, and each request starts a fresh sequence), and after the warm-up no request
    compiles anything (every prompt length was warmed up)."""
    after_warmup = {}
    warm_up = generate.warm_up

    def spy(*args, **kwargs):
        warm_up(*args, **kwargs)
        after_warmup.update(_jit_entries())

    monkeypatch.setattr(generate, "warm_up", spy)
    prompts = PROMPTS + PROMPTS[:1]
    results = jobs.run(_config(prompts=prompts, warmup=True), str(tmp_path))
    assert after_warmup and _jit_entries() == after_warmup

    on_disk = json.loads((tmp_path / "results.json").read_text())
    reqs = on_disk["requests"]
    assert len(reqs) == len(results["requests"]) == 3
    for p, r in zip(prompts, reqs):
        assert r["prompt"] == p and r["prompt_ids"] == list(p.encode())
        assert r["generated_token_ids"] == single[p]
        assert r["generated_text"] and r["ttft_s"] > 0 and r["decode_tok_per_s"] > 0
    # The single-request fields describe the first request.
    assert on_disk["prompt"] == PROMPTS[0] and on_disk["generated_token_ids"] == single[PROMPTS[0]]
    t = on_disk["timings"]
    assert t["ttft_s"] == t["cold_ttft_s"] == reqs[0]["ttft_s"]
    assert t["ttft_per_request_s"] == [r["ttft_s"] for r in reqs]
    assert t["warm_ttft_s"] == pytest.approx((reqs[1]["ttft_s"] + reqs[2]["ttft_s"]) / 2)
    cc = t["cache_clock"]
    assert len(cc["ttft_per_request_s"]) == 3 and cc["warm_ttft_s"] is not None


def test_resident_experts_run_several_prompts(single, tmp_path):
    c = _config(prompts=PROMPTS)
    c.cache.enabled = False
    results = jobs.run(c, str(tmp_path))
    assert [r["generated_token_ids"] for r in results["requests"]] == [single[p] for p in PROMPTS]
    t = results["timings"]
    assert "cache_clock" not in t and "cache" not in results
    assert len(t["ttft_per_request_s"]) == 2 and t["warm_ttft_s"] == t["ttft_per_request_s"][1]


def test_repeated_prompt_is_warm_at_full_capacity(tmp_path, capsys):
    """Capacity for every expert: the second request of a repeated prompt finds every expert
    its prefill needs resident (no stall), so its TTFT on the cache's clock is below the first's."""
    c = _config(prompts=PROMPTS[:1] * 2)
    c.cache.capacity_frac = 1.0
    results = jobs.run(c, str(tmp_path))
    first, second = results["requests"]
    assert first["generated_token_ids"] == second["generated_token_ids"]
    cc = results["timings"]["cache_clock"]
    assert cc["cold_ttft_s"] == cc["ttft_per_request_s"][0]
    assert cc["warm_ttft_s"] == cc["ttft_per_request_s"][1] < cc["cold_ttft_s"]
    prefills = [p for p in results["cache"]["passes"] if p["kind"] == "prefill"]
    assert len(prefills) == 2 and prefills[0]["stall_s"] > 0 and prefills[1]["stall_s"] == 0
    # How the runtime ran its passes: speculative ones (the virtual clock: none failed for
    # an expert in flight, a wall clock's reason).
    spec = results["speculation"]
    assert spec["speculative_passes"] > 0 and spec["failed_in_flight"] == 0
    assert spec["failed_checks"] >= spec["failed_mid_pass"]
    assert spec["host_copy_reads"] > 0  # the CPU backend: cold misses read from host copies
    # ... and the run says so in a line of its own.
    line = next(x for x in capsys.readouterr().out.splitlines()
                if x.startswith("live runtime: "))
    assert line.startswith(f"live runtime: {spec['speculative_passes']} speculative passes "
                           f"({spec['checked_mid_pass']} checked mid-pass, "
                           f"{spec['host_copy_reads']} expert reads from the host copy), "
                           f"{spec['failed_checks']} failed check")
    assert line.endswith(f"; {spec['complete_cache_passes']} passes over a complete cache "
                         "decided after them")
    resident = _config(prompts=PROMPTS[:1])
    resident.cache.enabled = False
    assert "speculation" not in jobs.run(resident, str(tmp_path / "resident"))


def test_one_prompt_reports_no_warm_ttft(single, tmp_path):
    results = jobs.run(_config(prompts=PROMPTS[1:]), str(tmp_path))
    t = results["timings"]
    assert len(results["requests"]) == 1 and t["warm_ttft_s"] is None
    assert t["cache_clock"]["warm_ttft_s"] is None
    assert results["generated_token_ids"] == single[PROMPTS[1]]


def test_each_request_prints_its_text_labelled_before_anything_else(tmp_path, capsys):
    """The run's first lines are its requests' texts (the prompt, then what followed it), each
    labelled with the field its prompt came from and the tokens generated after it."""
    capsys.readouterr()
    results = jobs.run(_config(prompts=PROMPTS), str(tmp_path))
    out = capsys.readouterr().out
    texts = [r["prompt"] + r["generated_text"] for r in results["requests"]]
    assert texts[0].startswith(PROMPTS[0]) and texts[1].startswith(PROMPTS[1])
    assert out.startswith(f"generated (run.prompts[0] + {NEW} tokens): {texts[0]}\n"
                          f"generated (run.prompts[1] + {NEW} tokens): {texts[1]}\n"), out


def test_a_profiled_run_says_where_its_trace_is_and_how_to_open_it(tmp_path, capsys):
    c = _config(prompt=PROMPTS[1])
    c.run.max_new_tokens = 2
    c.profile.enabled = True
    work = tmp_path / "w"
    results = jobs.run(c, str(work))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"generated (run.prompt + 2 tokens): {PROMPTS[1]}")
    # Where jax.profiler.trace writes: <dir>/plugins/profile/<time>/<host>.xplane.pb.
    found = glob.glob(str(work / "profile" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert len(found) == 1 and results["profile_dir"] == str(work / "profile")
    assert lines[-2] == (f"profile (XProf trace of the timed requests): {found[0]}; open it "
                         f"with: pip install xprof; xprof --logdir={work / 'profile'} "
                         "--port=8791 (then http://localhost:8791)")
    assert lines[-1] == f"results -> {work / 'results.json'}"


_LIMIT = embedded_config().max_position_embeddings


@pytest.mark.parametrize("run,extra,message", [
    ({"prompts": ("a", "b"), "prompt_ids": "1,2"}, {},
     "run.prompts=['a', 'b'] and run.prompt_ids='1,2' are both given"),
    ({"prompts": ("a", "")}, {}, "run.prompts[1] is empty"),
    ({"prompts": ("a", 3)}, {}, "run.prompts[1]=3 is not a string"),
    ({"prompts": ("ab", "x" * 10), "max_new_tokens": _LIMIT - 5}, {},
     "run.prompts[1]: prompt (10 tokens) + run.max_new_tokens"),
    ({"prompts": ("a", "b")}, {"tracing.record": True}, "tracing.record"),
])
def test_bad_prompts_are_named(run, extra, message, tmp_path):
    c = _config(**run)
    for field, value in extra.items():
        group, name = field.split(".")
        setattr(getattr(c, group), name, value)
    with pytest.raises(ConfigError, match=re.escape(message)):
        jobs.run(c, str(tmp_path))


@pytest.mark.parametrize("argv", [
    ['--config.run.prompts=["The Python interpreter", "def main():"]'],
    ['--config.run.prompts="The Python interpreter"', '--config.run.prompts="def main():"'],
])
def test_command_line_forms(argv):
    """The forms the config comment documents parse to the list of prompts."""
    argv = ["prog", f"--config={os.path.join(ROOT, 'configs', 'default.py')}", *argv]
    fv = flags.FlagValues()  # as moejax/main.py declares it (sys_argv: these, not the process')
    holder = config_flags.DEFINE_config_file("config", None, "", flag_values=fv,
                                             lock_config=True, sys_argv=argv)
    fv(argv)
    assert tuple(holder.value.run.prompts) == PROMPTS
