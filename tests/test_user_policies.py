"""Policies in a user's own file (`policies.modules`, `moejax/policies/user_modules.py`), the
shipped example `examples/policies/mru.py`, and installed packages' entry points."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

from moejax import jobs
from moejax.errors import ConfigError
from moejax.jobs.schema import base_config
from moejax.policies import KINDS, build, conformance, names, user_modules
from moejax.replay import replay

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MRU_FILE = os.path.join(ROOT, "examples", "policies", "mru.py")
CAPTURE = os.path.join(ROOT, "moejax", "assets", "captures", "olmoe_code.jsonl")


@pytest.fixture(autouse=True)
def _built_in_policies_only():
    """Each test's modules are taken out after it: the other test modules sharing this worker
    process see the built-in registry."""
    yield
    user_modules.unload()


def _keeping_keys(name: str, doc: str, choose: str, cls: str = "Mine") -> str:
    """The source of a user's file with one eviction policy, `name` (class `cls`): it keeps its
    resident keys in admission order, and `choose` is its victim (an expression of `keys`, the
    evictable ones in that order)."""
    return textwrap.dedent(f'''
        import random

        from moejax.policies import EvictionPolicy, register

        @register("eviction", {name!r})
        class {cls}(EvictionPolicy):
            """{doc}."""
            def __init__(self):
                self.keys = []
            def on_admit(self, key, pos, prefetch):
                self.keys.append(key)
            def on_evict(self, key):
                self.keys.remove(key)
            def victim(self, pos, evictable, incoming=None):
                keys = [k for k in self.keys if evictable(k)]
                return {choose} if keys else None
    ''')


def _by_admission(name: str, doc: str, newest_first: bool) -> str:
    """`_keeping_keys` whose victim is the earliest admitted key still resident, or the newest."""
    return _keeping_keys(name, doc, "keys[-1]" if newest_first else "keys[0]")


def _replay(workdir: str, eviction: str, modules: str = "") -> dict:
    c = base_config()
    c.job = "replay"
    c.replay.trace = CAPTURE
    c.cache.slots = 256
    c.policies.eviction, c.policies.prefetch = eviction, "none"
    c.policies.modules = modules
    c.log.tensorboard = False
    return jobs.run(c, workdir)


def test_the_example_mru_evicts_the_most_recently_used_evictable_key():
    user_modules.load(MRU_FILE)
    mru = build("eviction", "mru")
    for key in [(0, 1), (0, 2), (1, 3)]:
        mru.on_admit(key, key[0], False)
    mru.on_access((0, 1), 0)  # (0, 1) is now the most recent
    assert mru.victim(1, lambda k: True) == (0, 1)
    assert mru.victim(1, lambda k: k != (0, 1)) == (1, 3)
    mru.on_evict((0, 1))
    assert mru.victim(1, lambda k: True) == (1, 3)
    assert mru.victim(1, lambda k: False) is None


def test_unload_leaves_the_built_in_policies_as_they_were():
    before = {kind: names(kind) for kind in KINDS}
    user_modules.load(MRU_FILE)
    assert names("eviction") == sorted([*before["eviction"], "mru"])
    user_modules.unload()
    assert {kind: names(kind) for kind in KINDS} == before


def test_a_replay_with_a_users_policy_records_its_file_and_runs_on_the_reference(tmp_path):
    results = _replay(str(tmp_path / "mru"), "mru", modules=MRU_FILE)
    with open(MRU_FILE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    assert results["policy_modules"] == [{"module": MRU_FILE, "path": MRU_FILE,
                                          "sha256": digest, "registers": ["eviction mru"]}]
    on_disk = json.loads((tmp_path / "mru" / "results.json").read_text())
    assert on_disk["policy_modules"] == results["policy_modules"]
    assert results["replay"]["engine"] == "reference"
    total = results["cache"]["total"]
    assert total["hits"] + total["late_hits"] + total["misses"] == total["requests"]
    # MRU keeps the experts LRU would evict: on a decode capture, whose layers recur in
    # order, the two differ.
    lru_results = _replay(str(tmp_path / "lru"), "lru")
    lru = lru_results["cache"]["total"]
    assert (total["hits"], total["misses"]) != (lru["hits"], lru["misses"])
    assert "policy_modules" not in lru_results  # it named none, and no package registers one


def test_results_name_the_code_that_ran_even_if_the_file_changed_after_the_check(tmp_path):
    mine = tmp_path / "mru_copy.py"
    original = open(MRU_FILE).read()
    mine.write_text(original)
    c = base_config()
    c.job, c.replay.trace, c.cache.slots = "replay", CAPTURE, 64
    c.policies.eviction, c.policies.prefetch, c.policies.modules = "mru", "none", str(mine)
    c.log.tensorboard = False
    jobs.check(c, warn=False)
    mine.write_text(original + "# edited while the run was starting\n")
    results = jobs.run(c, str(tmp_path / "w"), checked=True)
    assert results["policy_modules"][0]["sha256"] == hashlib.sha256(original.encode()).hexdigest()


def test_a_module_named_by_its_import_name_loads(tmp_path, monkeypatch):
    (tmp_path / "lab_policies.py").write_text(
        _by_admission("lab_first_in", "Evicts the earliest admitted key still resident",
                      newest_first=False))
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = user_modules.load("lab_policies")
    assert [item.registers for item in loaded] == [("eviction lab_first_in",)]
    assert loaded[0].path == str(tmp_path / "lab_policies.py")
    assert "lab_first_in" in names("eviction")
    # Loaded again: the same module, nothing registered twice.
    assert user_modules.load("lab_policies") == loaded


@pytest.mark.parametrize("source, message", [
    ("", r"'{path}' is not a file"),
    ("raise RuntimeError('no GPU here')",
     r"importing '{path}' failed: RuntimeError: no GPU here"),
    ("from moejax.policies import EvictionPolicy, register\n"
     "@register('eviction', 'lru')\nclass Mine(EvictionPolicy):\n    pass\n",
     r"eviction policy 'lru' is registered already, by moejax\.policies\.eviction\.LRU"),
])
def test_a_bad_module_is_a_one_line_error_naming_it(tmp_path, source, message):
    path = str(tmp_path / "mine.py")
    if source:
        (tmp_path / "mine.py").write_text(source)
    c = base_config()
    c.job = "replay"
    c.policies.modules = path
    with pytest.raises(ConfigError, match=message.format(path=path.replace(".", r"\."))) as e:
        jobs.check(c, warn=False)
    assert str(e.value).startswith("policies.modules: ") and "\n" not in str(e.value)


def test_a_module_that_is_not_importable_is_named():
    with pytest.raises(ConfigError, match=r"'no_such_policies' is neither a \.py file nor an "
                                          r"importable module"):
        user_modules.load("no_such_policies")


@pytest.mark.slow
def test_an_installed_packages_entry_point_registers_its_policies(tmp_path):
    """A package installed with an entry point in the `moejax.policies` group: its policies
    are listed and run without `policies.modules` (a distribution's metadata on the path, as
    pip leaves it)."""
    (tmp_path / "pkg_policies.py").write_text(
        _by_admission("pkg_newest", "Evicts the newest admitted key", newest_first=True))
    info = tmp_path / "pkg_policies-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg-policies\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[moejax.policies]\npkg = pkg_policies\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    out = subprocess.run([sys.executable, "-m", "moejax.policies", "--list"], env=env,
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "eviction pkg_newest -- Evicts the newest admitted key" in out.stdout.splitlines()


SWEEP = '''
def get_config(arg=None):
    from moejax.jobs.schema import base_config

    c = base_config()
    c.job = "replay"
    c.replay.trace = {capture!r}
    c.policies.modules = {mru!r}
    c.policies.eviction, c.policies.prefetch = "mru", "none"
    c.log.tensorboard = False
    return c


def sweep(add):
    for slots in (64, 256):
        add(**{{"cache.slots": slots}})
'''


@pytest.mark.slow
def test_a_sweeps_workers_run_a_users_policy(tmp_path):
    """The launcher checks the cells and each pool worker runs them, every process loading the
    user's file from the config."""
    config = tmp_path / "grid.py"
    config.write_text(SWEEP.format(capture=CAPTURE, mru=MRU_FILE))
    out = subprocess.run([sys.executable, "-m", "launch.sweep", f"--config={config}",
                          f"--sweep_dir={tmp_path / 's'}", "--workers=2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    found = sorted(str(p) for p in (tmp_path / "s").rglob("results.json"))
    assert len(found) == 2, found
    for path in found:
        results = json.loads(open(path).read())
        assert results["policy_modules"][0]["registers"] == ["eviction mru"]
        assert results["config"]["policies"]["eviction"] == "mru"
        assert results["replay"]["engine"] == "reference"


LAST_PASS_FILE = os.path.join(ROOT, "examples", "policies", "last_pass.py")
BAD = '''
import random

from moejax.policies import EvictionPolicy, register


@register("eviction", "bad_anyone")
class Anyone(EvictionPolicy):
    """Names a key that may not be resident."""

    def victim(self, pos, evictable, incoming=None):
        return (0, 0)
''' + _keeping_keys("bad_dice", "A victim drawn from an unseeded generator",
                     "random.choice(keys)", cls="Dice")


def test_the_example_prefetcher_gives_the_built_in_temporals_numbers(tmp_path):
    c = base_config()
    c.job, c.replay.trace, c.cache.slots = "replay", CAPTURE, 256
    c.policies.modules = LAST_PASS_FILE
    c.log.tensorboard = False
    runs = {}
    for prefetch in ("last_pass", "temporal(lookahead=1)"):
        c.policies.prefetch = prefetch
        c.replay.engine = "reference"
        runs[prefetch] = jobs.run(c, str(tmp_path / prefetch.split("(")[0]))["cache"]["total"]
    mine, built_in = runs["last_pass"], runs["temporal(lookahead=1)"]
    assert mine["prefetch_issued"] > 0
    for key in ("hits", "late_hits", "misses", "collision_misses", "prefetch_issued",
                "prefetch_used"):
        assert mine[key] == built_in[key], key


def test_the_conformance_kit_passes_the_examples():
    # Three checks on each of a capture's three sizes, on the scored trace and on the one with
    # empty layers; MRU's live run against its replay too (once here: it compiles a model).
    for target, kind, captures, live, n in (
            (f"{MRU_FILE}:MRU", "eviction mru", ("olmoe_code",), True, 16),
            (f"{LAST_PASS_FILE}:LastPass", "prefetch last_pass", (), False, 6)):
        report = conformance.check(target, captures=captures, live=live)
        assert report.policy == kind
        assert report.passed, report.table()
        assert len(report.results) == n
        assert {r.check for r in report.results} == {
            "accounting", "capacity", "determinism", *(["live"] if live else [])}
        assert all(r.applies for r in report.results)
    assert report.results[-1].condition.startswith("empty layers")
    assert "not applicable" not in report.table()


def test_the_conformance_kit_fails_a_bad_victim_and_a_random_one(tmp_path):
    bad = tmp_path / "bad_policies.py"
    bad.write_text(BAD)
    anyone = conformance.check(f"{bad}:Anyone", captures=("olmoe_code",), live=False)
    assert not anyone.passed
    first = anyone.results[0]
    assert (first.check, first.condition, first.passed) == (
        "runs", "olmoe_code, 5% of experts", False)
    assert "bad_anyone chose (0, 0), which is protected or not resident" in first.detail
    dice = conformance.check(f"{bad}:Dice", captures=("olmoe_code",), live=False)
    failed = {r.check for r in dice.results if not r.passed}
    assert failed == {"determinism"}, dice.table()
    assert "FAIL  determinism" in dice.table()


def test_the_conformance_command_exits_1_on_a_failure_and_2_on_a_bad_target(tmp_path, capsys):
    bad = tmp_path / "bad_policies.py"
    bad.write_text(BAD)
    assert conformance.main([f"{bad}:Anyone", "--captures=olmoe_code", "--no-live"]) == 1
    assert capsys.readouterr().out.startswith("eviction bad_anyone: 0 of 5 checks passed\n")
    assert conformance.main([f"{bad}:Nobody"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("registers no policy class 'Nobody' (it registers: eviction "
                        "bad_anyone, eviction bad_dice)") and len(err.splitlines()) == 1
    assert conformance.main(["mru"]) == 2
    assert "give FILE.py:Class or module:Class" in capsys.readouterr().err


@pytest.mark.slow
def test_a_live_run_runs_a_users_policy(tmp_path):
    """The embedded model generating, its cache evicting with the user's MRU."""
    c = base_config()  # configs/default.py's config: the embedded model, generate
    c.policies.modules, c.policies.eviction = MRU_FILE, "mru"
    c.run.max_new_tokens = 4
    c.log.tensorboard = False
    results = jobs.run(c, str(tmp_path / "live"))
    assert results["job"] == "generate" and len(results["generated_token_ids"]) > 0
    assert results["policy_modules"][0]["registers"] == ["eviction mru"]
    total = results["cache"]["total"]
    assert total["requests"] > 0
    assert total["hits"] + total["late_hits"] + total["misses"] == total["requests"]


def test_the_conformance_kit_fails_an_mru_that_evicts_a_pinned_expert(tmp_path):
    """The README's MRU with the `evictable` test left out: the expert used last is often one
    the running wave pins, and the cache refuses it; the kit names where."""
    broken = tmp_path / "mru_broken.py"
    broken.write_text(open(MRU_FILE).read().replace(
        "next((key for key in reversed(self.order) if evictable(key)), None)",
        "next(reversed(self.order), None)"))
    report = conformance.check(f"{broken}:MRU", captures=("olmoe_code",), live=False)
    failed = [r for r in report.results if not r.passed]
    assert failed and not report.passed
    assert (failed[0].check, failed[0].condition) == ("runs", "olmoe_code, 5% of experts")
    assert "which is protected or not resident" in failed[0].detail


SHARED_TABLE = '''
from moejax.policies import EvictionPolicy, register

USES = {}  # key -> its uses, for the one cache of the process


@register("eviction", "shared_lfu")
class SharedLFU(EvictionPolicy):
    """Least frequently used first, counted in a table of the module's."""

    def __init__(self):
        USES.clear()  # a new cache counts from zero
        self.keys = []

    def on_admit(self, key, pos, prefetch):
        self.keys.append(key)

    def on_access(self, key, pos):
        USES[key] = USES.get(key, 0) + 1

    def on_evict(self, key):
        self.keys.remove(key)

    def victim(self, pos, evictable, incoming=None):
        keys = [k for k in self.keys if evictable(k)]
        return min(keys, key=lambda k: USES.get(k, 0)) if keys else None
'''


def test_the_conformance_kit_fails_a_policy_whose_live_run_is_not_its_replay(tmp_path):
    """An LFU whose counts live in its module, not its instance: deterministic in replay, but
    the live run's warm-up builds a throwaway cache after the timed run's and runs passes on it,
    and those counts are in the table when the timed run starts."""
    mine = tmp_path / "shared_policies.py"
    mine.write_text(SHARED_TABLE)
    report = conformance.check(f"{mine}:SharedLFU", captures=())
    failed = [r for r in report.results if not r.passed]
    assert [(r.check, r.condition) for r in failed] == [
        ("live", "olmoe_code, 12 passes live (OLMoE-1B-7B, width 32) = replay, 64 slots")]
    assert failed[0].detail.startswith("live and replay differ: hits "), failed[0].detail
    assert "FAIL  live" in report.table() and not report.passed


def test_the_conformance_kit_says_the_live_check_does_not_apply_to_a_replay_only_policy():
    report = conformance.check("moejax.policies.eviction:Belady", captures=())
    live = report.results[-1]
    assert (live.check, live.applies, live.passed) == ("live", False, True)
    assert live.detail == ("n/a: eviction belady is replay_only (it reads the future routing): "
                           "it cannot run live")
    assert report.passed
    table = report.table()
    assert table.startswith("eviction belady: 6 of 6 checks passed, 1 not applicable\n")
    assert "  n/a   live " in table


LAYER_BEFORE = '''
from moejax.policies import EvictionPolicy, register


@register("eviction", "layer_before")
class LayerBefore(EvictionPolicy):
    """The oldest expert of the MoE layer before the incoming one's (it runs again last)."""

    def set_layer_positions(self, pos_of):
        self.held = {layer: [] for layer in pos_of}  # each MoE layer's keys, oldest first

    def on_admit(self, key, pos, prefetch):
        self.held[key[0]].append(key)

    def on_evict(self, key):
        self.held[key[0]].remove(key)

    def victim(self, pos, evictable, incoming=None):
        layer = incoming[0]
        before = layer - 1 if layer > min(self.held) else max(self.held)
        keys = [k for k in self.held[before] if evictable(k)]  # (a dense layer holds none)
        keys = keys or [k for held in self.held.values() for k in held if evictable(k)]
        return keys[0] if keys else None
'''


def test_the_conformance_kit_fails_a_policy_that_takes_a_dense_layer_for_a_moe_one(tmp_path):
    """The layer before MoE layer 3 is taken to be layer 2: right where MoE layers are
    consecutive, and a crash where a dense layer, which holds no experts, sits between them;
    the kit's empty-layers condition has such gaps, and shows the error."""
    mine = tmp_path / "layer_before.py"
    mine.write_text(LAYER_BEFORE)
    report = conformance.check(f"{mine}:LayerBefore", captures=(), live=False)
    failed = [r for r in report.results if not r.passed]
    assert [(r.check, r.condition.split(" (")[0], r.detail) for r in failed] == [
        ("runs", "empty layers", "KeyError: 2")], report.table()
    assert "FAIL  runs         empty layers (MoE 1, 3, 6;" in report.table()


def test_the_empty_layers_condition_has_gaps_an_unused_layer_and_layers_holding_nothing():
    condition, (trace,), slots = conformance.conditions(())[-1]
    assert condition.startswith("empty layers") and slots == 2 * trace.top_k
    assert trace.layers == [1, 3, 6]
    assert set(trace.ids[:, 1].ravel().tolist()) <= {0, 1}  # layer 3's other experts: never
    cache = conformance.cache_with("eviction", "lru", trace, slots)
    asked, held_none = [0], [0]
    victim = cache.eviction.victim

    def counting(pos, evictable, incoming=None):
        asked[0] += 1
        held_none[0] += not any(key[0] == incoming[0] for key in cache.residency)
        return victim(pos, evictable, incoming)

    cache.eviction.victim = counting
    replay(cache, [trace], engine="reference")
    # The incoming expert's layer held none of its experts at a good share of the victims.
    assert asked[0] > 100 and held_none[0] > asked[0] // 4, (asked, held_none)


def test_a_module_imported_already_says_what_it_registered_and_stays_registered():
    loaded = user_modules.load("moejax.policies.s3fifo")
    assert [item.registers for item in loaded] == [("eviction s3fifo",)]
    user_modules.unload()  # moejax's own module: not this loader's to take out
    assert "s3fifo" in names("eviction")


def test_listing_with_a_missing_module_is_a_one_line_error(capsys):
    from moejax.policies.__main__ import main

    assert main(["--list", "--modules=no_such_dir/mine.py"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("policies.modules: 'no_such_dir/mine.py' is not a file (it takes paths "
                        "to .py files or importable module names, comma-separated)")
    assert len(err.splitlines()) == 1


def test_the_conformance_kit_refuses_python_without_assertions():
    out = subprocess.run([sys.executable, "-O", "-m", "moejax.policies.conformance",
                          f"{MRU_FILE}:MRU"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "python -m moejax.policies.conformance: error: the conformance kit needs Python's "
        "assertions: run it without -O"]


def test_the_file_of_a_policy_imported_already_names_it_without_a_second_import():
    """A shipped policy named by its file (`moejax/policies/s3fifo.py:S3FIFO`) is the module
    imported already, not a second registration of its name."""
    assert conformance.resolve_target("moejax/policies/s3fifo.py:S3FIFO") == ("eviction",
                                                                                "s3fifo")
    (loaded,) = user_modules.load("moejax/policies/arc.py")
    assert loaded.given == "moejax/policies/arc.py" and loaded.registers == ("eviction arc",)

