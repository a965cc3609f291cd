"""The two slot-load paths (`cache.load_path`, moejax/serving/slot_pool.py): "fused" (one
compiled step slices, moves and writes) and "copy_stream" (`jax.device_put` of each expert's
record or entry, placed when a step reads the slot), and the coalescing of a wave's loads
(`SlotPools.load_many`).

* whatever a step reads of a pool (`arrays(slots)`) after any sequence of loads (repeats into
  one slot included) holds, in those slots, exactly the host bytes of the last expert loaded
  into each: both paths, bfloat16 and packed int4, from host tables and from per-expert host
  entries (the disk tier's form);
* `load_many` moves its loads in one `device_put` (one record per expert, superseded loads
  not moved) and places nothing until a step reads the slots; a live run dispatches a wave's
  loads together;
* a live run's logits are bit-identical on both paths, and equal the resident model's at the
  same precision whenever the policies keep the selection (plain fetch, standard routing), at
  any capacity, eviction, prefetch and miss policy, native or int4, with or without the disk
  tier.
"""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax import checkpoint
from moejax.errors import ConfigError
from moejax.families import preset
from moejax.jobs.schema import base_config
from moejax.jobs.specs import model_spec, resolve
from moejax.model_source import load_model
from moejax.models.random_init import random_model
from moejax.models.stepped import ResidentExperts, SteppedDecoder
from moejax.policies import names
from moejax.quant.quantizer import quantize
from moejax.serving import slot_pool
from moejax.serving.build import build_cached_experts
from moejax.serving.runtime import CachedExperts
from moejax.serving.slot_pool import SlotPool, SlotPools, resolve_load_path
from tests.fuzzing import examples

PATHS = ("fused", "copy_stream")
MAX_LEN, NEW = 24, 4


def test_auto_is_copy_stream_on_an_accelerator_and_fused_on_the_cpu_backend():
    assert resolve_load_path("auto", "cpu") == "fused"
    assert resolve_load_path("auto", "gpu") == "copy_stream"
    assert resolve_load_path("auto", "tpu") == "copy_stream"
    assert resolve_load_path("copy_stream", "cpu") == "copy_stream"
    assert resolve_load_path("fused", "gpu") == "fused"
    with pytest.raises(ConfigError, match=r"cache\.load_path='stream' is not one of"):
        resolve_load_path("stream")


# --- a pool's slots after a sequence of loads ---------------------------------------------

E, H, I, SLOTS = 5, 32, 16, 4


def _tables(precision: str, layers: int = 2):
    """Host tables per layer (`[E, ...]` leaves in host memory): bfloat16, or packed int4
    (uint8 values, float16 scales and zero points); the live runs below are float32."""
    rng = np.random.default_rng(precision == "int4")
    gate_up, down = {}, {}
    for layer in range(layers):
        g = rng.standard_normal((E, H, 2 * I)).astype(jnp.bfloat16)
        d = rng.standard_normal((E, I, H)).astype(jnp.bfloat16)
        if precision == "int4":
            g, d = quantize(g, "int4"), quantize(d, "int4")
            gate_up[layer], down[layer] = g.map(checkpoint.to_host), d.map(checkpoint.to_host)
        else:
            gate_up[layer], down[layer] = checkpoint.to_host(g), checkpoint.to_host(d)
    return gate_up, down


class _Entries:
    """A host store as the disk tier's (`HostExperts.get`): each expert's own host arrays."""

    def __init__(self, gate_up, down):
        self.entries = {(layer, e): jax.tree.map(
            lambda a, e=e: checkpoint.to_host(np.asarray(a)[e]), (gate_up[layer], down[layer]))
            for layer in gate_up for e in range(E)}

    def get(self, key):
        return self.entries[key]


_TABLES = {p: _tables(p) for p in ("native", "int4")}

loads_st = st.lists(st.tuples(st.integers(0, 1), st.integers(0, E - 1),
                              st.integers(0, SLOTS - 1)), min_size=1, max_size=40)


@settings(max_examples=examples(20))
@given(loads=loads_st, precision=st.sampled_from(("native", "int4")),
       path=st.sampled_from(PATHS), from_entries=st.booleans(), split=st.integers(1, 3),
       reads=st.lists(st.sets(st.integers(0, SLOTS - 1)), min_size=3, max_size=3),
       staged=st.sampled_from((slot_pool.STAGED, 2)), via_pools=st.booleans())
def test_each_slot_holds_the_bytes_of_the_last_expert_loaded_into_it(
        loads, precision, path, from_entries, split, reads, staged, via_pools):
    """`staged`: copy_stream's bound on experts moved at once and held unplaced (2: a wave
    goes in pieces, and placing is forced before a read); `via_pools`: through `SlotPools`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(slot_pool, "STAGED", staged)
        _load_and_read(loads, precision, path, from_entries, split, reads, via_pools)


def _load_and_read(loads, precision, path, from_entries, split, reads, via_pools):
    gate_up_t, down_t = _TABLES[precision]
    if from_entries:
        store = _Entries(gate_up_t, down_t)
        templates = (jax.tree.map(lambda a: a[:1], gate_up_t[0]),
                     jax.tree.map(lambda a: a[:1], down_t[0]))
        pool = SlotPool(SLOTS, {0: templates[0]}, {0: templates[1]}, store, path)
    else:
        pool = SlotPool(SLOTS, gate_up_t, down_t, load_path=path)
    assert pool.load_path == path
    target = SlotPools([pool]) if via_pools else pool
    items = [((layer, e), slot) for layer, e, slot in loads]
    # The loads in `split` calls (load_many, and load for calls of one), each followed by a
    # step's read of some slots: what it reads there is the last expert loaded into them.
    done = 0
    for part, read in zip(np.array_split(np.arange(len(items)), split), reads):
        chunk = [items[i] for i in part]
        if len(chunk) == 1:
            target.load(*chunk[0])
        else:
            target.load_many(chunk)
        done += len(chunk)
        assert len(pool.pending) <= slot_pool.STAGED  # what is held unplaced stays bounded
        gate_up, down = target.arrays(read)
        if precision == "int4":
            gate_up, down = gate_up[0], down[0]
        _check_slots((gate_up, down), read, items[:done], (gate_up_t, down_t))
    # Read whole, every slot holds its last load (or zeros: never loaded).
    _check_slots((pool.gate_up, pool.down), range(SLOTS), items, (gate_up_t, down_t))
    assert pool.loads == len(items)


def _check_slots(held, slots, loads, tables):
    last = {slot: key for key, slot in loads}
    for slot in slots:
        got = jax.tree.map(lambda a: np.asarray(a)[slot], held)
        if slot in last:
            layer, e = last[slot]
            want = jax.tree.map(lambda a: np.asarray(a)[e], (tables[0][layer], tables[1][layer]))
        else:
            want = jax.tree.map(np.zeros_like, got)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"slot {slot}")


# --- live runs -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny preset (4 MoE layers x 16 experts, top-4) saved as a packed checkpoint with
    int4 copies, and loaded with its experts in host memory."""
    cfg = preset("olmoe", "tiny")
    model, gate_up, down = random_model(cfg, seed=3)
    path = str(tmp_path_factory.mktemp("load_paths") / "packed")
    checkpoint.save_model(path, model, gate_up, down, precisions=("int4",), group_size=16,
                          expert_layout="packed")
    m = base_config().model
    m.checkpoint = path
    return model, load_model(model_spec(m)), path


def _prompt(cfg):
    return np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 7))


def _config(load_path, slots, precision="", eviction="lru", prefetch="none", miss="fetch",
            routing="standard", host_frac=1.0):
    c = base_config()
    c.cache.load_path, c.cache.slots, c.cache.precision = load_path, slots, precision
    c.cache.host_capacity_frac = host_frac
    c.policies.eviction, c.policies.prefetch = eviction, prefetch
    c.policies.miss, c.policies.routing = miss, routing
    c.io.workers = 2
    return c


def _run(model, loaded, config, prompt):
    source = build_cached_experts(resolve(config), loaded)
    dec = SteppedDecoder(model, source, max_len=MAX_LEN, lookahead=2)
    out = dec.generate(prompt, NEW, keep_logits=True)
    source.cache.finish()
    return out, source


_resident: dict = {}


def _reference(model, loaded, precision, prompt):
    if precision not in _resident:
        experts = ResidentExperts.from_host(*loaded.experts_at(precision))
        dec = SteppedDecoder(model, experts, max_len=MAX_LEN, lookahead=2)
        _resident[precision] = dec.generate(prompt, NEW, keep_logits=True)
    return _resident[precision]


def _logits(out) -> list:
    return [out.prefill_logits, *out.step_logits]


def _same(a, b):
    assert a.generated_ids == b.generated_ids
    for x, y in zip(_logits(a), _logits(b), strict=True):
        np.testing.assert_array_equal(x, y)


EVICTIONS = names("eviction", live=True)
PREFETCHES = names("prefetch", live=True)
# (miss, routing): plain fetch under standard routing keeps the router's selection (the
# resident model's logits), the others change it (at the cache's one precision); the first
# is drawn half the time.
POLICIES = (("fetch", "standard"), ("fetch", "standard"), ("fetch", "standard"),
            ("drop(keep=2)", "standard"), ("substitute(tol=0.2)", "cache_aware"),
            ("fetch", "cache_aware"))


@settings(max_examples=examples(8))
@given(precision=st.sampled_from(("native", "int4")), slots=st.sampled_from((5, 64)),
       eviction=st.sampled_from(EVICTIONS), prefetch=st.sampled_from(PREFETCHES),
       policies=st.sampled_from(POLICIES), host_frac=st.sampled_from((1.0, 0.25, 0.5)))
def test_both_load_paths_give_the_same_logits_and_keep_the_resident_models(
        tiny, precision, slots, eviction, prefetch, policies, host_frac):
    model, loaded, path = tiny
    if host_frac < 1:  # the disk tier reads the experts from the checkpoint
        m = base_config().model
        m.checkpoint = path
        loaded = load_model(model_spec(m), read_experts=False)
    prompt = _prompt(model.cfg)
    outs = {}
    for load_path in PATHS:
        config = _config(load_path, slots, "" if precision == "native" else precision,
                         eviction, prefetch, *policies, host_frac)
        outs[load_path], source = _run(model, loaded, config, prompt)
        assert {p.load_path for p in source.pool.pools} == {load_path}
        assert (source.host_store is not None) == (host_frac < 1)
        assert source.pool.loads > 0
    _same(outs["copy_stream"], outs["fused"])
    if policies == ("fetch", "standard"):
        _same(outs["copy_stream"], _reference(model, loaded, precision, prompt))


# --- coalescing ------------------------------------------------------------------------------


def _spy(monkeypatch, module, name):
    """Counts the calls of `module.name` (still calling it)."""
    calls = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_load_many_moves_its_experts_in_one_device_put_and_places_them_when_read(monkeypatch):
    native, int4 = _TABLES["native"], _TABLES["int4"]
    pools = SlotPools([SlotPool(SLOTS, *native, load_path="copy_stream"),
                       SlotPool(SLOTS, *int4, load_path="copy_stream")])
    puts = _spy(monkeypatch, jax, "device_put")
    places = _spy(monkeypatch, slot_pool, "_place")
    loads = [((0, 1), 0), ((1, 2), 5), ((1, 3), 1), ((0, 4), 6), ((1, 0), 7), ((0, 2), 0)]
    pools.load_many(loads)
    assert len(puts) == 1
    leaves = jax.tree.leaves(puts[0][0])
    # One record per expert: 2 native loads (the first into slot 0 is superseded by the last:
    # not moved) and 3 int4 ones, each exactly the expert's bytes (packed: values, scales and
    # zero points).
    assert len(leaves) == 2 + 3
    per_expert = {p: sum(a.nbytes for a in jax.tree.leaves((t[0][0], t[1][0]))) // E
                  for p, t in _TABLES.items()}
    assert sum(leaf.nbytes for leaf in leaves) == 2 * per_expert["native"] + \
        3 * per_expert["int4"]
    assert {leaf.sharding.memory_kind for leaf in leaves} == {"pinned_host"}
    assert pools.loads == len(loads)
    assert not places  # placed when a step reads the slots
    pools.arrays([5])  # pool 1's local slot 1 only
    assert len(places) == 1
    assert sorted(pools.pools[1].pending) == [2, 3] and sorted(pools.pools[0].pending) == [0, 1]
    gate_up, _ = pools.arrays()
    assert len(places) == 5 and not any(p.pending for p in pools.pools)  # one per expert
    np.testing.assert_array_equal(np.asarray(gate_up[0][0]), np.asarray(native[0][0][2]))
    assert len(puts) == 1  # placing moves nothing more from the host


def test_a_live_run_dispatches_each_waves_loads_together(monkeypatch, tiny):
    """At a small capacity (no prefetch, no disk tier) every wave's loads go in at most one
    `load_many` call: never more calls carrying loads than waves."""
    model, loaded, _ = tiny
    calls = []
    real = SlotPools.load_many
    monkeypatch.setattr(SlotPools, "load_many",
                        lambda self, loads: (calls.append(len(loads)), real(self, loads))[1])
    waves = []
    real_for = CachedExperts.experts_for

    def counted(self, gate):
        for wave in real_for(self, gate):
            waves.append(wave)
            yield wave

    monkeypatch.setattr(CachedExperts, "experts_for", counted)
    out, source = _run(model, loaded, _config("copy_stream", slots=5), _prompt(model.cfg))
    made = [n for n in calls if n]
    assert sum(made) == source.pool.loads > len(waves) >= len(made), (made, len(waves))
    assert max(made) > 1


# --- host memory ---------------------------------------------------------------------------


def _pinned_bytes() -> int:
    gc.collect()
    return sum(a.nbytes for a in jax.live_arrays() if a.sharding.memory_kind == "pinned_host")


def _fresh(path: str):
    m = base_config().model
    m.checkpoint = path
    return load_model(model_spec(m))


@pytest.mark.parametrize("precision", ("native", "int4"))
def test_copy_stream_holds_each_expert_once_in_host_memory(tiny, precision):
    """copy_stream's per-expert records take the place of the checkpoint's host tables, a
    layer at a time: building the runtime adds no second copy of the experts to pinned host
    memory, its records are every expert's bytes, and a later `experts_at` reads the same
    bytes from disk again."""
    model, _, path = tiny
    level = "" if precision == "native" else precision  # (`cache.precision`)
    loaded = _fresh(path)
    tables = loaded.experts_at(precision)
    expected = sum(leaf.nbytes for leaf in jax.tree.leaves(tables))
    want = jax.tree.map(lambda a: np.array(a, copy=True), tables)  # (a view holds the buffer)
    del tables
    before = _pinned_bytes()
    source = build_cached_experts(resolve(_config("copy_stream", 5, level)), loaded)
    grown = _pinned_bytes() - before
    pool = source.pool.pools[0]
    keys = [(layer, e) for layer in model.cfg.moe_layers for e in range(model.cfg.num_experts)]
    records = pool.host_entries(keys)
    assert sum(r.nbytes for r in records) == expected
    assert {r.sharding.memory_kind for r in records} == {"pinned_host"}
    # The records are the one copy (before: the tables stayed too, `grown` == `expected`).
    assert grown < expected / 4, (grown, expected)
    assert all(leaf.shape[0] == 1 for leaf in jax.tree.leaves((pool.host_gate_up,
                                                               pool.host_down)))
    # A second runtime from the model reads the same records: nothing is copied again.
    before = _pinned_bytes()
    other = build_cached_experts(resolve(_config("copy_stream", 7, level)), loaded)
    assert _pinned_bytes() - before < expected / 4
    assert all(a is b for a, b in zip(other.pool.pools[0].host_entries(keys), records,
                                      strict=True))
    again = loaded.experts_at(precision)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)
    out, _ = _run(model, loaded, _config("copy_stream", 5, level), _prompt(model.cfg))
    _same(out, _reference(model, loaded, precision, _prompt(model.cfg)))


def test_copy_stream_leaves_weights_drawn_in_memory_where_they_are():
    """Weights drawn in memory cannot be read again: the runtime copies them and the loaded
    model keeps its own, unchanged; the copy is made once for every runtime built from it."""
    m = base_config().model
    m.preset, m.family = "tiny", "olmoe"
    loaded = load_model(model_spec(m))
    held = {layer: np.asarray(v) for layer, v in loaded.host_gate_up.items()}
    source = build_cached_experts(resolve(_config("copy_stream", 5)), loaded)
    assert loaded.host_gate_up is not None and set(loaded.host_gate_up) == set(held)
    for layer, v in held.items():
        np.testing.assert_array_equal(np.asarray(loaded.host_gate_up[layer]), v)
    key = [(loaded.cfg.moe_layers[0], 0)]
    again = build_cached_experts(resolve(_config("copy_stream", 7)), loaded)
    assert again.pool.pools[0].host_entries(key)[0] is source.pool.pools[0].host_entries(key)[0]


def test_copy_stream_cuts_the_records_of_weights_drawn_in_memory_from_their_numpy_arrays():
    """Records cut from a bfloat16 host table would leave a host copy JAX keeps with the table
    (one more copy of every expert): a model drawn in memory gives its numpy arrays instead,
    and the build adds the records alone to pinned host memory, the same bytes."""
    m = base_config().model
    m.preset, m.family, m.width = "olmoe-1b-7b", "olmoe", 32
    loaded = load_model(model_spec(m))
    assert loaded.cfg.dtype == "bfloat16"
    tables = loaded.host_gate_up, loaded.host_down
    expected = sum(leaf.nbytes for leaf in jax.tree.leaves(tables))
    gc.collect()
    held = jax.live_arrays()  # (held, so that no new array can take an old one's id)
    before = {id(a) for a in held}
    source = build_cached_experts(resolve(_config("copy_stream", 64)), loaded)
    added = [a for a in jax.live_arrays()
             if id(a) not in before and a.sharding.memory_kind == "pinned_host"]
    del held
    assert sum(a.nbytes for a in added) == expected
    keys = [(layer, e) for layer in loaded.cfg.moe_layers[:2] for e in (0, 5)]
    for (layer, e), record in zip(keys, source.pool.pools[0].host_entries(keys), strict=True):
        want = np.concatenate([np.asarray(t[layer][e]).reshape(-1).view(np.uint8)
                               for t in tables])
        np.testing.assert_array_equal(np.asarray(record), want)
    prompt = _prompt(loaded.cfg)
    _same(_run(loaded.model, loaded, _config("copy_stream", 64), prompt)[0],
          _run(loaded.model, loaded, _config("fused", 64), prompt)[0])


def test_copy_stream_keeps_the_tables_when_experts_run_on_the_host(tiny):
    """Host compute reads the host tables (`CachedExperts._host_tables`): they are not handed
    over, and a run computing misses on the host still decodes as the resident model."""
    model, _, path = tiny
    loaded = _fresh(path)
    config = _config("copy_stream", 5, miss="host_compute")
    source = build_cached_experts(resolve(config), loaded)
    pool = source.pool.pools[0]
    assert loaded.host_gate_up is not None
    assert set(pool.host_gate_up) == set(model.cfg.moe_layers)
    assert pool.host_gate_up[model.cfg.moe_layers[0]].shape[0] == model.cfg.num_experts
    out, source = _run(model, loaded, config, _prompt(model.cfg))
    assert source.cache.metrics.totals()["host_computed"] > 0
    _same(out, _reference(model, loaded, "native", _prompt(model.cfg)))
