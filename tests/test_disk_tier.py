"""The disk tier live (DESIGN.md "The disk tier"): a tiny model saved in both layouts, run with
its experts on storage behind a host tier of every size — real reads (TensorStore chunks or
packed range reads), real pinned-host entries, real slot loads.

* exactness: the generated tokens and logits equal the resident model's for any host size,
  policy, layout and read split (every live eviction, host eviction and live prefetch of the
  registry at least once, rotating beside the others), and at int4;
* only experts that are needed are read, each read counted by the host tier;
* a corrupt expert stops the run naming the file, layer and expert;
* the generate job as a user runs it, and replay equivalence of its recorded trace.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax import checkpoint, jobs
from moejax.checkpoint import CheckpointError
from moejax.families import preset
from moejax.jobs.schema import base_config
from moejax.jobs.specs import model_spec, resolve
from moejax.model_source import load_model
from moejax.models.random_init import random_model
from moejax.models.stepped import SteppedDecoder
from moejax.policies import names, policy_class
from moejax.serving.build import build_cached_experts
from moejax.testing import resident_decoder
from tests.fuzzing import examples

MAX_LEN, NEW = 32, 5
LAYOUTS = ("zarr", "packed")
# The tiny preset: 4 MoE layers x 16 experts; a host tier holds at least one layer (1/4).
HOST_FRACS = (0.25, 0.4, 0.75)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = preset("olmoe", "tiny")
    model, gate_up, down = random_model(cfg, seed=5)
    root = tmp_path_factory.mktemp("disk")
    paths = {}
    for kind in LAYOUTS:
        paths[kind] = str(root / kind)
        checkpoint.save_model(paths[kind], model, gate_up, down, precisions=("int4",),
                          group_size=16, expert_layout=kind)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 9))
    reference = resident_decoder(model, gate_up, down, max_len=MAX_LEN, lookahead=2).generate(
        prompt, NEW, keep_logits=True)
    return model, paths, prompt, reference


def _config(host_frac, slots=6, eviction="lru", host_eviction="lru", prefetch="none",
            split=1, precision=""):
    c = base_config()
    c.cache.slots, c.cache.precision = slots, precision
    c.cache.host_capacity_frac, c.cache.host_eviction = host_frac, host_eviction
    c.policies.eviction, c.policies.prefetch = eviction, prefetch
    c.io.split, c.io.workers = split, 3
    return c


def _run(model, path, config, prompt):
    m = base_config().model
    m.checkpoint = path
    loaded = load_model(model_spec(m), read_experts=False)
    source = build_cached_experts(resolve(config), loaded)
    dec = SteppedDecoder(model, source, max_len=MAX_LEN, lookahead=2)
    out = dec.generate(prompt, NEW, keep_logits=True)
    source.cache.finish()
    return out, source


def _exactness_cases() -> list:
    """Every live device eviction, every host eviction (the registry's, but those reading the
    future or the router's probabilities, which the host tier refuses) and every live prefetch
    at least once, rotating beside the layouts, host sizes, read splits and slot counts."""
    device = names("eviction", live=True)
    host = [n for n in names("eviction") if not (policy_class("eviction", n).needs_future
                                                 or policy_class("eviction", n).needs_probs)]
    prefetch = names("prefetch", live=True)
    cases = []
    for i in range(max(len(device), len(host), len(prefetch))):
        case = (LAYOUTS[i % 2], HOST_FRACS[i % 3], device[i % len(device)],
                host[(i + 4) % len(host)], prefetch[i % len(prefetch)], 1 + 3 * i % 8,
                (4, 9, 30)[i // 2 % 3])
        cases.append(pytest.param(*case, id="-".join(map(str, case))))
    return cases


@pytest.mark.parametrize("kind, host, eviction, host_eviction, prefetch, split, slots",
                         _exactness_cases())
def test_any_host_capacity_generates_what_everything_in_memory_does(
        tiny, kind, host, eviction, host_eviction, prefetch, split, slots):
    model, paths, prompt, ref = tiny
    config = _config(host, slots, eviction, host_eviction, prefetch, split)
    out, source = _run(model, paths[kind], config, prompt)
    assert out.generated_ids == ref.generated_ids
    np.testing.assert_array_equal(out.prefill_logits, ref.prefill_logits)
    for a, b in zip(out.step_logits, ref.step_logits, strict=True):
        np.testing.assert_array_equal(a, b)
    host_tier = source.cache.host
    host_tier.check_invariants()
    t = host_tier.totals()
    # Every storage read the host tier counted was one real read, and nothing else was read.
    assert source.host_store.reads == t["storage_reads"] > 0
    assert len(source.host_store) <= host_tier.capacity


def test_int4_experts_on_storage_equal_the_resident_int4_model(tiny):
    model, paths, prompt, _ = tiny
    m = base_config().model
    m.checkpoint = paths["packed"]
    resident = load_model(model_spec(m))
    from moejax.models.stepped import ResidentExperts

    ref = SteppedDecoder(model, ResidentExperts.from_host(*resident.experts_at("int4")),
                         max_len=MAX_LEN, lookahead=2).generate(prompt, NEW, keep_logits=True)
    out, source = _run(model, paths["packed"], _config(0.25, 6, precision="int4"), prompt)
    assert out.generated_ids == ref.generated_ids
    for a, b in zip(out.step_logits, ref.step_logits, strict=True):
        np.testing.assert_array_equal(a, b)
    assert source.cache.host.read_bytes == source.cache.shape.expert_bytes  # int4 bytes


def test_a_model_loaded_for_the_disk_tier_reads_no_expert_at_start(tiny):
    _, paths, _, _ = tiny
    m = base_config().model
    m.checkpoint = paths["packed"]
    loaded = load_model(model_spec(m), read_experts=False)
    assert loaded.host_gate_up is None
    gate_up, _ = loaded.experts_at("native")  # a job that wants them all still gets them
    assert set(gate_up) == set(loaded.cfg.moe_layers)


@pytest.mark.parametrize("kind", LAYOUTS)
def test_a_corrupt_expert_stops_the_run_naming_file_layer_and_expert(tiny, tmp_path, kind):
    model, paths, prompt, _ = tiny
    path = str(tmp_path / kind)
    shutil.copytree(paths[kind], path)
    layer = model.cfg.moe_layers[0]
    # Flip a byte inside every expert of the first MoE layer: whichever is read first fails.
    if kind == "packed":
        f = os.path.join(path, "experts", f"layer_{layer:03d}", "native.packed")
        stride = json.load(open(os.path.join(path, "config.json")))[
            "expert_layout"]["precisions"]["native"]["stride"]
        data = bytearray(open(f, "rb").read())
        for e in range(model.cfg.num_experts):
            data[e * stride + 5] ^= 0xFF
        open(f, "wb").write(bytes(data))
    else:
        for e in range(model.cfg.num_experts):
            f = os.path.join(path, "experts", f"layer_{layer:03d}", "gate_up", "c", str(e),
                             "0", "0")
            data = bytearray(open(f, "rb").read())
            data[5] ^= 0xFF
            open(f, "wb").write(bytes(data))
    with pytest.raises(CheckpointError) as err:
        _run(model, path, _config(0.5), prompt)
    msg = str(err.value)
    assert re.search(rf"\blayer {layer}\b", msg) and re.search(r"\bexpert \d+\b", msg), msg
    assert path in msg, msg


def test_the_generate_job_with_experts_on_storage_and_its_replay(tiny, tmp_path):
    """As a user: a packed checkpoint at host_capacity_frac=0.3 generates the tokens it
    generates with everything in memory, results.json shows the storage reads, and a replay of
    its trace reproduces every counter and time, the host tier's included."""
    _, paths, _, _ = tiny
    runs = {}
    for host in (1.0, 0.3):
        c = base_config()
        c.model.checkpoint = paths["packed"]
        c.run.prompt_ids, c.run.max_new_tokens = "5,17,3,99,42,7", 6
        c.cache.slots, c.cache.host_capacity_frac = 6, host
        c.policies.prefetch = "score_percentile(p=80)"
        c.storage.preset, c.io.split = "sata_ssd", 4
        c.log.progress, c.tracing.record = False, host < 1
        # The modelled clock on any backend (auto is the wall clock on a GPU): its times are
        # what the replay below reproduces, and the storage reads' cost below is sata_ssd's.
        c.clock.kind = "virtual"
        runs[host] = jobs.run(c, str(tmp_path / f"h{host}"))
    full, disk = runs[1.0], runs[0.3]
    assert disk["generated_token_ids"] == full["generated_token_ids"]
    assert "host" not in full["cache"]
    h = disk["cache"]["host"]
    assert h["total"]["storage_reads"] > 0 and h["storage"]["preset"] == "sata_ssd"
    # Reads land in reused buffers, and the buffers stay within the host bound (in experts;
    # a buffer is the packed record's stride, the expert's bytes rounded up to whole pages).
    assert h["reads"] > h["read_buffers"] > 0, h
    assert h["read_buffers"] <= h["capacity_experts"], h
    stride = json.load(open(os.path.join(paths["packed"], "config.json")))[
        "expert_layout"]["precisions"]["native"]["stride"]
    assert h["read_buffer_bytes"] == h["read_buffers"] * stride
    assert disk["cache"]["timing"]["decode_s"] > full["cache"]["timing"]["decode_s"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "h0.3" / "tensorboard"))
    acc.Reload()
    reads = acc.Scalars("storage/bytes")
    assert reads[-1].value == h["total"]["storage_bytes"]
    assert acc.Scalars("host/hit_rate")[-1].value == pytest.approx(h["total"]["hit_rate"])

    c = base_config()
    c.job, c.replay.trace, c.model.preset, c.clock.kind = "replay", disk["trace"], "", "virtual"
    c.cache.slots, c.cache.host_capacity_frac, c.storage.preset = 6, 0.3, "sata_ssd"
    c.policies.prefetch = "score_percentile(p=80)"
    c.log.progress = c.log.tensorboard = False
    replayed = jobs.run(c, str(tmp_path / "replay"))
    for part in ("total", "per_layer", "timing"):
        assert replayed["cache"][part] == disk["cache"][part], part
    # The host tier's decisions, counters and times too; what the live store measured itself
    # (`live`; `peak_bytes`: its buffers, dropped ones awaiting loads included) is its own.
    from moejax.cache.host_tier import LIVE_KEYS

    measured = ("peak_bytes", *LIVE_KEYS)
    assert {k: v for k, v in replayed["cache"]["host"].items() if k not in measured} == \
        {k: v for k, v in h.items() if k not in measured}
    assert not set(LIVE_KEYS) & set(replayed["cache"]["host"])
    assert replayed["cache"]["host"]["peak_bytes"] <= h["capacity_bytes"]
    assert h["peak_bytes"] <= h["capacity_bytes"]
    assert h["reads"] == h["total"]["storage_reads"] + h["total"]["preload_reads"]


def test_replay_and_the_live_runtime_issue_the_same_reads_in_the_same_order(
        tiny, tmp_path, monkeypatch):
    """The live store reads exactly what the host tier decides, in its order: the reads
    before the first token (a reserved full layer, read for its loads only), then every
    demand and read-ahead read — and a replay of the run's trace decides the same reads."""
    from moejax.cache.host_tier import HostTier
    from moejax.serving.host_store import HostExperts

    stores, replayed = [], []
    store_init, preload, tier_init = HostExperts.__init__, HostTier.preload, HostTier.__init__

    def capture_store(self, *args, **kw):
        store_init(self, *args, **kw)
        stores.append(self)

    monkeypatch.setattr(HostExperts, "__init__", capture_store)
    _, paths, _, _ = tiny

    def config():
        c = base_config()
        c.cache.slots, c.cache.host_capacity_frac, c.cache.full_layers = 22, 0.3, 1
        c.policies.prefetch = "score_percentile(p=80)"
        c.log.progress = c.log.tensorboard = False
        return c

    c = config()
    c.model.checkpoint, c.tracing.record = paths["packed"], True
    c.run.prompt_ids, c.run.max_new_tokens = "5,17,3,99,42,7", 6
    c.run.warmup = False  # one runtime, the one whose trace is recorded
    live = jobs.run(c, str(tmp_path / "live"))

    class Recorder:  # the replayed tier's sink: what a live store would be told to read
        def read(self, key):
            replayed.append(key)

        def drop(self, key):
            pass

    def record_tier(self, *args, **kw):
        tier_init(self, *args, **kw)
        self.sink = Recorder()

    def record_preload(self, keys):
        transient, seeded = preload(self, keys)
        replayed.extend(transient + seeded)
        return transient, seeded

    monkeypatch.setattr(HostTier, "__init__", record_tier)
    monkeypatch.setattr(HostTier, "preload", record_preload)
    c = config()
    c.job, c.replay.trace, c.model.preset, c.clock.kind = "replay", live["trace"], "", "virtual"
    jobs.run(c, str(tmp_path / "replay"))
    (store,) = stores
    h = live["cache"]["host"]["total"]
    assert h["preload_reads"] == 16  # the reserved layer: 16 experts, none held by the tier
    assert store.read_log == replayed
    assert len(replayed) == h["storage_reads"] + h["preload_reads"] > h["preload_reads"]


class _SlowReader:
    """An `ExpertReader` whose every read takes `delay` seconds longer (a slow disk), on a pool
    of its own as wide as the real reader's."""

    def __init__(self, reader, delay: float):
        import concurrent.futures

        self.reader, self.delay = reader, delay
        self.pool = concurrent.futures.ThreadPoolExecutor(reader.workers)

    def submit(self, layer, expert, precision):
        import time

        def read():
            time.sleep(self.delay)
            return self.reader.submit(layer, expert, precision).result()

        return self.pool.submit(read)


def _generate_from_a_slow_disk(tiny, config):
    """The tiny model's tokens through `config`'s cache, its experts read from the packed
    checkpoint by a slow disk (20 ms a read): (the expert source, its host store). The tokens
    are checked against the resident model's."""
    model, paths, prompt, ref = tiny
    m = base_config().model
    m.checkpoint = paths["packed"]
    source = build_cached_experts(resolve(config), load_model(model_spec(m), read_experts=False))
    store = source.host_store
    store.reader = _SlowReader(store.reader, 0.02)
    out = SteppedDecoder(model, source, max_len=MAX_LEN, lookahead=2).generate(
        prompt, NEW, keep_logits=True)
    assert out.generated_ids == ref.generated_ids
    return source, store


@settings(max_examples=examples(6), deadline=None)
@given(eviction=st.sampled_from(names("eviction", live=True)),
       host_eviction=st.sampled_from(["lru", "fifo", "least_stale", "lfu", "fld"]),
       prefetch=st.sampled_from(names("prefetch", live=True)),
       host=st.sampled_from(HOST_FRACS), slots=st.sampled_from([4, 9, 30]),
       full_layers=st.sampled_from([0, 1]))
def test_the_host_bound_holds_every_buffer_under_any_policy_mix(
        tiny, eviction, host_eviction, prefetch, host, slots, full_layers):
    """Every host buffer the live store holds — entries, reads in flight, dropped entries a
    queued load still reads — stays within the tier's bound, with reads in flight (a slow
    disk: 20 ms a read); the tokens are the resident model's. (That a wave's reads are in
    flight together: the test below, on a case built to read wave after wave.)"""
    if full_layers and slots < 16 + 4:
        slots = 22  # a reserved layer (16 experts) and room for one more layer's top-k
    config = _config(host, slots, eviction, host_eviction, prefetch, split=2)
    config.cache.full_layers = full_layers
    source, store = _generate_from_a_slow_disk(tiny, config)
    tier = source.cache.host
    report = tier.to_dict()
    assert store.peak_held <= tier.capacity
    assert report["peak_bytes"] <= report["capacity_bytes"]
    assert store.reads == report["reads"] == (report["total"]["storage_reads"]
                                              + report["total"]["preload_reads"])


def test_the_reads_of_a_wave_of_misses_are_in_flight_together(tiny):
    """Four slots for 4 layers x 16 experts (top-4), no prefetch, a host tier of one layer: a
    wave's experts are mostly demand misses read from storage, and a slow disk (20 ms a
    read) keeps each read running while the wave's next ones are submitted."""
    source, store = _generate_from_a_slow_disk(
        tiny, _config(0.25, 4, "lru", "lru", "none", split=2))
    total = source.cache.host.to_dict()["total"]
    # The case is what it was built to be: most storage reads are demand misses, many of them.
    assert total["demand_misses"] > total["storage_reads"] / 2 > 4, total
    assert store.max_reads_in_flight >= 2
