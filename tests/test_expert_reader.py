"""Per-expert asynchronous reads (`ExpertReader`) from both expert layouts: results equal the
expert's slice of the full load at every precision and split, concurrent submits are safe, and a
damaged, truncated or missing packed file fails that expert's read with an error naming the
file, layer, expert and precision — in both I/O modes (`io.mode`): pread, and mmap, whose
results are bit-identical read-only views of the mapping that stay valid after `close()`."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gc
import os
import re
import shutil

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax import checkpoint
from moejax.checkpoint import LAYOUTS, CheckpointError, expert_store, packed
from moejax.checkpoint.expert_reader import ExpertReader
from moejax.checkpoint.params import flat_params
from moejax.errors import ConfigError
from moejax.families import preset
from moejax.models.decoder import abstract_decoder
from moejax.models.random_init import random_experts
from moejax.quant.weights import QuantizedWeights
from moejax.run_spec import IO_MODES, MAX_SPLIT

PRECISIONS = ("native", "int8", "int4", "int2")


@pytest.fixture(scope="module")
def cfg():
    # H=64, I=32, 16 experts, 4 MoE layers, bfloat16 experts.
    return dataclasses.replace(preset("olmoe", "tiny"), dtype="bfloat16")


@pytest.fixture(scope="module")
def saved(cfg, tmp_path_factory):
    """Both layouts of one model (random dense parameters: no model init), every precision."""
    root = tmp_path_factory.mktemp("reader")
    rng = np.random.default_rng(0)
    dense = {k: rng.standard_normal(v.shape).astype(v.dtype)
             for k, v in flat_params(abstract_decoder(cfg)).items()}
    gate_up, down = random_experts(cfg, seed=3)
    out = {}
    for kind in LAYOUTS:
        out[kind] = str(root / kind)
        checkpoint.save(out[kind], cfg, dense, ((l, gate_up[l], down[l]) for l in cfg.moe_layers),
                    precisions=PRECISIONS[1:], group_size=16, calibration="minmax",
                    expert_layout=kind)
    return out


@pytest.fixture(scope="module")
def full(saved):
    """Every expert at every precision as numpy, from the zarr layout's full load."""
    ck = checkpoint.load(saved["zarr"])
    to_np = {p: tuple({l: (w.map(np.asarray) if isinstance(w, QuantizedWeights)
                           else np.asarray(w)) for l, w in kind.items()}
                      for kind in ck.experts_at(p)) for p in PRECISIONS}
    return to_np


@pytest.fixture(scope="module")
def precisions(saved):
    return checkpoint.read_precisions(saved["packed"])


@pytest.fixture
def copy(saved, tmp_path):
    d = str(tmp_path / "ckpt")
    shutil.copytree(saved["packed"], d)
    return d


def _assert_expert(got, full, layer, expert, precision):
    for w, whole in zip(got, full[precision]):
        want = whole[layer]
        if precision == "native":
            assert isinstance(w, np.ndarray) and w.dtype == want.dtype
            assert w.shape == want.shape[1:] and w.tobytes() == want[expert].tobytes()
            continue
        assert isinstance(w, QuantizedWeights) and w.bits == want.bits
        for part in expert_store.PARTS:
            a, b = getattr(w, part), getattr(want, part)[expert]
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _assert_names(msg, path, layer, expert, precision):
    assert path in msg, msg
    assert re.search(rf"\blayer {layer}\b", msg) and re.search(rf"\bexpert {expert}\b", msg), msg
    assert precision in msg, msg


@pytest.mark.parametrize("kind", LAYOUTS)
def test_every_expert_equals_the_full_load(cfg, saved, full, precisions, kind):
    with ExpertReader(saved[kind], cfg, precisions, split=3, workers=4) as reader:
        assert reader.layout == kind
        futures = {(l, e, p): reader.submit(l, e, p) for p in PRECISIONS
                   for l in cfg.moe_layers for e in range(cfg.num_experts)}
        for (l, e, p), future in futures.items():
            _assert_expert(future.result(), full, l, e, p)


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(LAYOUTS), layer=st.integers(0, 3), expert=st.integers(0, 15),
       precision=st.sampled_from(PRECISIONS), split=st.integers(1, MAX_SPLIT),
       workers=st.integers(1, 8))
def test_reads_at_any_split(cfg, saved, full, precisions, kind, layer, expert, precision,
                            split, workers):
    with ExpertReader(saved[kind], cfg, precisions, split=split, workers=workers) as reader:
        _assert_expert(reader.read(layer, expert, precision), full, layer, expert, precision)


@pytest.mark.parametrize("mode", IO_MODES)
def test_concurrent_submits(cfg, saved, full, precisions, mode):
    with ExpertReader(saved["packed"], cfg, precisions, split=8, workers=3, mode=mode) as reader:
        def layer_reads(layer):
            fs = [(e, p, reader.submit(layer, e, p)) for e in range(16) for p in PRECISIONS]
            return [(layer, e, p, f.result()) for e, p, f in fs]

        with concurrent.futures.ThreadPoolExecutor(4) as callers:
            for results in callers.map(layer_reads, cfg.moe_layers):
                for layer, e, p, got in results:
                    _assert_expert(got, full, layer, e, p)


def test_expert_nbytes(cfg, saved, precisions):
    index = checkpoint.read_expert_index(saved["packed"])
    with ExpertReader(saved["packed"], cfg, precisions) as reader:
        for p in PRECISIONS:
            stride = reader.expert_nbytes(p)
            assert stride == index.records[p].stride and stride % 4096 == 0
            assert os.path.getsize(packed.file_path(saved["packed"], 0, p)) == 16 * stride
    with ExpertReader(saved["zarr"], cfg, precisions) as reader:
        # Uncompressed chunks: the payload plus a 4-byte crc32c per chunk.
        native = (64 * 64 + 32 * 64) * 2
        assert reader.expert_nbytes("native") == native + 2 * 4
        int4 = index.records["int4"]
        assert reader.expert_nbytes("int4") == sum(x.nbytes for x in int4.parts) + 6 * 4


@pytest.mark.parametrize("mode", IO_MODES)
@pytest.mark.parametrize("split", [1, 8])
def test_flipped_byte_fails_that_expert(cfg, copy, precisions, split, mode):
    record = checkpoint.read_expert_index(copy).records["int4"]
    path = packed.file_path(copy, 2, "int4")
    with open(path, "r+b") as f:
        at = 6 * record.stride + record.parts[3].offset + 5  # down's values
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x01]))
    with ExpertReader(copy, cfg, precisions, split=split, mode=mode) as reader:
        with pytest.raises(CheckpointError) as info:
            reader.read(2, 6, "int4")
        _assert_names(str(info.value), path, 2, 6, "int4")
        assert "corrupt" in str(info.value)
        reader.read(2, 5, "int4")  # its neighbours, and other precisions, still read
        reader.read(2, 6, "int8")


@pytest.mark.parametrize("mode", IO_MODES)
def test_truncated_file_fails_the_missing_experts(cfg, copy, precisions, mode):
    record = checkpoint.read_expert_index(copy).records["native"]
    path = packed.file_path(copy, 1, "native")
    with open(path, "r+b") as f:
        f.truncate(10 * record.stride + 4096)
    with ExpertReader(copy, cfg, precisions, split=2, mode=mode) as reader:
        for expert in (10, 15):
            with pytest.raises(CheckpointError) as info:
                reader.read(1, expert, "native")
            msg = str(info.value)
            _assert_names(msg, path, 1, expert, "native")
            assert "short read" in msg and "truncated" in msg
        reader.read(1, 9, "native")


@pytest.mark.parametrize("mode", IO_MODES)
def test_missing_file(cfg, copy, precisions, mode):
    path = packed.file_path(copy, 3, "int2")
    os.remove(path)
    with ExpertReader(copy, cfg, precisions, mode=mode) as reader:
        with pytest.raises(CheckpointError) as info:
            reader.read(3, 4, "int2")
        assert "missing" in str(info.value)
        _assert_names(str(info.value), path, 3, 4, "int2")


def test_corrupt_zarr_chunk(cfg, saved, precisions, tmp_path):
    d = str(tmp_path / "zarr")
    shutil.copytree(saved["zarr"], d)
    chunk = expert_store.chunk_path(d, 0, "down", 9, 3)
    with open(chunk, "r+b") as f:
        f.seek(100)
        byte = f.read(1)[0]
        f.seek(100)
        f.write(bytes([byte ^ 0xFF]))
    with ExpertReader(d, cfg, precisions, split=8) as reader:
        with pytest.raises(CheckpointError) as info:
            reader.read(0, 9, "native")
        assert chunk in str(info.value) and re.search(r"\bexpert 9\b", str(info.value))


@pytest.mark.parametrize("kwargs,field", [
    (dict(split=0), "io.split=0"), (dict(split=MAX_SPLIT + 1), f"io.split={MAX_SPLIT + 1}"),
    (dict(split=True), "io.split=True"), (dict(split=2.0), "io.split=2.0"),
    (dict(workers=0), "io.workers=0"), (dict(workers=-3), "io.workers=-3"),
])
def test_bad_io_settings(cfg, saved, precisions, kwargs, field):
    with pytest.raises(ConfigError) as info:
        ExpertReader(saved["packed"], cfg, precisions, **kwargs)
    assert field in str(info.value)
    if "split" in field:
        assert f"1 to {MAX_SPLIT}" in str(info.value)


def test_bad_requests_and_close(cfg, saved, precisions):
    native_only = {"native": precisions["native"]}
    reader = ExpertReader(saved["packed"], cfg, native_only, workers=1)
    with pytest.raises(ValueError, match="expert 16"):
        reader.submit(0, 16, "native")
    with pytest.raises(ValueError, match="layer 4"):
        reader.submit(4, 0, "native")
    with pytest.raises(ConfigError, match="int3"):
        reader.submit(0, 0, "int3")
    with pytest.raises(CheckpointError, match="no int4 experts"):
        reader.submit(0, 0, "int4")
    reader.close()
    reader.close()
    with pytest.raises(RuntimeError, match="closed"):
        reader.submit(0, 0, "native")


# -- io.mode="mmap" -------------------------------------------------------------------------


def _mapped(path: str) -> bool:
    """Whether this process maps `path` (Linux: /proc/self/maps names each file mapping)."""
    with open("/proc/self/maps") as f:
        return any(line.rstrip("\n").endswith(" " + os.path.realpath(path)) for line in f)


def _arrays(weights) -> list[np.ndarray]:
    return [a for w in weights
            for a in ([w] if isinstance(w, np.ndarray) else
                      [getattr(w, part) for part in expert_store.PARTS])]


@pytest.mark.parametrize("split", [1, 4])
@pytest.mark.parametrize("precision", ["native", "int4"])
def test_mmap_equals_pread(cfg, saved, full, precisions, precision, split):
    with ExpertReader(saved["packed"], cfg, precisions, split=split, mode="pread") as a, \
         ExpertReader(saved["packed"], cfg, precisions, split=split, mode="mmap") as b:
        assert b.mode == "mmap" and b.expert_nbytes(precision) == a.expert_nbytes(precision)
        for layer in cfg.moe_layers:
            futures = [(e, a.submit(layer, e, precision), b.submit(layer, e, precision))
                       for e in range(cfg.num_experts)]
            for e, fa, fb in futures:
                want, got = fa.result(), fb.result()
                _assert_expert(got, full, layer, e, precision)
                assert type(got) is type(want) and len(got) == len(want) == 2
                for x, y in zip(_arrays(want), _arrays(got)):
                    assert (x.dtype, x.shape, x.tobytes()) == (y.dtype, y.shape, y.tobytes())
                    # Zero copy: a read-only view of the layer file's mapping.
                    assert not y.flags.writeable and not y.flags.owndata


@settings(max_examples=15, deadline=None)
@given(layer=st.integers(0, 3), expert=st.integers(0, 15), precision=st.sampled_from(PRECISIONS),
       split=st.integers(1, MAX_SPLIT), workers=st.integers(1, 8))
def test_mmap_reads_at_any_split(cfg, saved, full, precisions, layer, expert, precision, split,
                                 workers):
    with ExpertReader(saved["packed"], cfg, precisions, split=split, workers=workers,
                      mode="mmap") as reader:
        _assert_expert(reader.read(layer, expert, precision), full, layer, expert, precision)


def test_mmap_empty_file_is_a_short_read(cfg, copy, precisions):
    path = packed.file_path(copy, 0, "int8")
    open(path, "wb").close()
    with ExpertReader(copy, cfg, precisions, split=3, mode="mmap") as reader:
        with pytest.raises(CheckpointError) as info:
            reader.read(0, 0, "int8")
        _assert_names(str(info.value), path, 0, 0, "int8")
        assert "short read" in str(info.value) and "the file is 0 bytes" in str(info.value)
        reader.read(0, 0, "int4")


def test_mmap_needs_the_packed_layout(cfg, saved, precisions):
    with pytest.raises(ConfigError) as info:
        ExpertReader(saved["zarr"], cfg, precisions, mode="mmap")
    msg = str(info.value)
    assert "io.mode='mmap'" in msg and "packed" in msg and saved["zarr"] in msg, msg
    assert msg.count("\n") == 0, msg


@pytest.mark.parametrize("kind", LAYOUTS)
def test_unknown_mode(cfg, saved, precisions, kind):
    with pytest.raises(ConfigError) as info:
        ExpertReader(saved[kind], cfg, precisions, mode="o_sync")
    assert "io.mode='o_sync'" in str(info.value) and "mmap" in str(info.value)


def test_mmap_results_outlive_close(cfg, copy, full, precisions):
    """close() unmaps a file only once no array read from it is alive: the arrays (and host
    arrays made from them, which alias them on the CPU backend) stay valid after it."""
    native, int4 = (packed.file_path(copy, 1, p) for p in ("native", "int4"))
    reader = ExpertReader(copy, cfg, precisions, split=2, mode="mmap")
    kept = reader.read(1, 7, "native")
    reader.read(1, 3, "int4")  # dropped at once: nothing of int4 is alive at close()
    down = reader.read(1, 9, "native")[1]
    host = checkpoint.to_host(down)
    aliased = host.unsafe_buffer_pointer() == down.ctypes.data
    assert aliased or jax.default_backend() != "cpu"  # the module docstring's claim
    del down
    assert _mapped(native) and _mapped(int4)
    reader.close()
    assert not _mapped(int4)  # unmapped by close()
    assert _mapped(native)  # kept by the live arrays
    _assert_expert(kept, full, 1, 7, "native")
    assert np.asarray(host).tobytes() == full["native"][1][1][9].tobytes()
    del kept
    gc.collect()
    assert _mapped(native) == aliased  # the host array views it, unless it is a copy
    assert np.asarray(host).tobytes() == full["native"][1][1][9].tobytes()
    del host
    gc.collect()
    assert not _mapped(native)
    with pytest.raises(RuntimeError, match="closed"):
        reader.submit(1, 7, "native")


def _takes_o_direct(path: str) -> bool:
    """Whether the file system of `path` opens files with O_DIRECT (ext4 does, tmpfs not)."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("precision", ["native", "int4"])
def test_direct_reads_equal_pread_or_are_refused_in_one_line(cfg, saved, full, precisions,
                                                             precision):
    """`io.mode=direct` (O_DIRECT, page-aligned buffers): the same experts as pread where the
    file system takes O_DIRECT, a one-line ConfigError naming io.mode where it does not."""
    first = packed.file_path(saved["packed"], cfg.moe_layers[0], next(iter(precisions)))
    if not _takes_o_direct(first):
        with pytest.raises(ConfigError, match="io.mode='direct': the file system of"):
            ExpertReader(saved["packed"], cfg, precisions, mode="direct")
        return
    with ExpertReader(saved["packed"], cfg, precisions, split=3, mode="direct") as reader:
        for layer in cfg.moe_layers:
            for e in range(cfg.num_experts):
                _assert_expert(reader.read(layer, e, precision), full, layer, e, precision)


def test_direct_needs_the_packed_layout(cfg, saved, precisions):
    with pytest.raises(ConfigError, match="io.mode='direct' needs a packed checkpoint"):
        ExpertReader(saved["zarr"], cfg, precisions, mode="direct")
