"""Quantized expert copies in the checkpoint: written beside the native experts, listed in
config.json, read back per layer and per expert, one shard file per part, and errors that name
the shard file, layer, expert, kind, precision and part at fault."""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest

from moejax import checkpoint
from moejax.checkpoint import CheckpointError, expert_store
from moejax.convert import add_precisions as convert_add_precisions
from moejax.convert import check_quant_flags, convert
from moejax.errors import ConfigError
from moejax.families import preset
from moejax.models.random_init import random_model
from moejax.quant import formats, weights
from moejax.quant.quantizer import quantize

PRECS = ("int8", "int4", "int2")


@pytest.fixture(scope="module")
def tiny():
    cfg = preset("olmoe", "tiny")  # H=64, I=32, 16 experts, 4 MoE layers
    return random_model(cfg, seed=1)


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory):
    model, gate_up, down = tiny
    out = str(tmp_path_factory.mktemp("q") / "ckpt")
    checkpoint.save_model(out, model, gate_up, down, precisions=PRECS, group_size=16,
                      calibration={"int2": "hqq"})
    return out


@pytest.fixture
def copy(saved, tmp_path):
    d = str(tmp_path / "ckpt")
    shutil.copytree(saved, d)
    return d


def _assert_names(msg, layer, expert, kind, precision):
    assert re.search(rf"\blayer {layer}\b", msg), msg
    assert re.search(rf"\bexpert {expert}\b", msg), msg
    assert kind in msg and precision in msg, msg


def test_save_with_precisions_reads_back(tiny, saved):
    model, gate_up, down = tiny
    cfg = model.cfg
    with open(os.path.join(saved, "config.json")) as f:
        listed = json.load(f)["precisions"]
    assert set(listed) == set(PRECS)
    assert listed["int2"] == {"group_size": 16, "calibration": "hqq",
                              "groups": {"gate_up": 16, "down": 16}}
    assert listed["int8"]["calibration"] == "absmax"
    assert checkpoint.read_config(saved) == cfg  # the extra key does not upset ModelConfig
    assert list(checkpoint.read_precisions(saved)) == ["native", *PRECS]

    ck = checkpoint.load(saved)
    assert list(ck.precisions) == ["native", *PRECS]
    assert ck.precisions["native"] == {"dtype": cfg.dtype}
    assert ck.experts_at("native") == (ck.host_gate_up, ck.host_down)
    for p in PRECS:
        gu, dn = ck.experts_at(p)
        assert ck.experts_at(p)[0] is gu  # read once, then cached
        assert set(gu) == set(dn) == set(cfg.moe_layers)
        for layer in cfg.moe_layers:
            for kind, host, src in (("gate_up", gu, gate_up), ("down", dn, down)):
                q = host[layer]
                assert isinstance(q, weights.QuantizedWeights) and q.bits == formats.BITS[p]
                assert q.values.sharding.memory_kind == checkpoint.host_memory_kind()
                want = quantize(np.asarray(src[layer]), p, 16, listed[p]["calibration"])
                got = q.map(np.asarray)
                np.testing.assert_array_equal(got.values, want.values)
                np.testing.assert_array_equal(got.scale, want.scale)
                np.testing.assert_array_equal(got.zero, want.zero)
                for expert in range(cfg.num_experts):
                    one = expert_store.read_quantized_expert(saved, layer, kind, p, expert)
                    assert one.bits == want.bits
                    for part in expert_store.PARTS:
                        np.testing.assert_array_equal(getattr(one, part),
                                                      getattr(want, part)[expert])


def test_no_precisions_means_native_only(tiny, tmp_path):
    model, gate_up, down = tiny
    out = str(tmp_path / "plain")
    checkpoint.save_model(out, model, gate_up, down)
    with open(os.path.join(out, "config.json")) as f:
        assert "precisions" not in json.load(f)
    ck = checkpoint.load(out)
    assert ck.precisions == {"native": {"dtype": model.cfg.dtype}}
    with pytest.raises(CheckpointError) as info:
        ck.experts_at("int4")
    msg = str(info.value)
    assert "int4" in msg and "['native']" in msg and "--add_precisions" in msg
    assert os.path.join(out, "config.json") in msg
    with pytest.raises(ConfigError, match="int3"):
        ck.experts_at("int3")


def test_absent_precision_names_those_present(tiny, tmp_path):
    model, gate_up, down = tiny
    out = str(tmp_path / "int8only")
    checkpoint.save_model(out, model, gate_up, down, precisions="int8")
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(out).experts_at("int2")
    msg = str(info.value)
    assert "no int2 experts" in msg and "['native', 'int8']" in msg
    assert "--precisions=int2" in msg


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def test_quantized_parts_are_one_shard_each(saved):
    """Each part of a copy is one shard file of every expert; the native arrays keep one file
    per expert."""
    cfg = checkpoint.read_config(saved)
    for kind in expert_store.KINDS:
        for p in PRECS:
            for part in expert_store.PARTS:
                path = expert_store.quant_path(saved, 0, kind, p, part)
                files = sorted(os.path.relpath(os.path.join(d, f), path)
                               for d, _, fs in os.walk(path) for f in fs)
                assert files == ["c/0/0/0", "zarr.json"]
                shard = expert_store.quant_shard_path(saved, 0, kind, p, part)
                assert shard == os.path.join(path, "c", "0", "0", "0")
                offsets = [expert_store.shard_entry(shard, e, cfg.num_experts)
                           for e in range(cfg.num_experts)]
                assert all(n > 0 for _, n in offsets)
                assert sorted(o for o, _ in offsets) == [o for o, _ in offsets]  # in order
    native = os.path.join(saved, "experts", "layer_000", "down", "c")
    assert len(os.listdir(native)) == cfg.num_experts


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x5A]))


@pytest.mark.parametrize("layer,kind,precision,part,expert", [
    (1, "gate_up", "int4", "values", 3), (0, "down", "int2", "scale", 0),
    (3, "down", "int8", "zero", 15)])
def test_flipped_byte_in_quantized_chunk(copy, layer, kind, precision, part, expert):
    shard = expert_store.quant_shard_path(copy, layer, kind, precision, part)
    offset, nbytes = expert_store.shard_entry(shard, expert, 16)
    _flip(shard, offset + nbytes // 2)
    ck = checkpoint.load(copy)  # native experts are fine; the copy is read on demand
    with pytest.raises(CheckpointError) as info:
        ck.experts_at(precision)
    msg = str(info.value)
    assert shard in msg and "corrupt" in msg
    _assert_names(msg, layer, expert, kind, precision)
    assert part in msg
    with pytest.raises(CheckpointError) as info:
        expert_store.read_quantized_expert(copy, layer, kind, precision, expert)
    assert shard in str(info.value) and "corrupt" in str(info.value)
    _assert_names(str(info.value), layer, expert, kind, precision)
    # Its neighbours in the same shard still read, and other precisions are unaffected.
    expert_store.read_quantized_expert(copy, layer, kind, precision, (expert + 1) % 16)
    other = next(p for p in PRECS if p != precision)
    ck.experts_at(other)


def test_flipped_byte_in_shard_index(copy):
    shard = expert_store.quant_shard_path(copy, 2, "gate_up", "int4", "scale")
    _flip(shard, os.path.getsize(shard) - 20)  # inside the index, before its crc32c
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(copy).experts_at("int4")
    msg = str(info.value)
    assert shard in msg and "corrupt shard index" in msg and re.search(r"\blayer 2\b", msg)
    assert "gate_up" in msg and "int4" in msg and "scale" in msg
    with pytest.raises(CheckpointError, match="corrupt shard index"):
        expert_store.read_quantized_expert(copy, 2, "gate_up", "int4", 5)


@pytest.mark.parametrize("layer,kind,precision,part", [
    (2, "gate_up", "int2", "values"), (0, "down", "int4", "zero")])
def test_missing_quantized_shard(copy, layer, kind, precision, part):
    shard = expert_store.quant_shard_path(copy, layer, kind, precision, part)
    os.remove(shard)  # zarr would read the fill value: must be an error instead
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(copy).experts_at(precision)
    msg = str(info.value)
    assert shard in msg and "missing" in msg and part in msg
    assert re.search(rf"\blayer {layer}\b", msg) and kind in msg and precision in msg
    with pytest.raises(CheckpointError) as info:
        expert_store.read_quantized_expert(copy, layer, kind, precision, 7)
    assert shard in str(info.value) and "missing" in str(info.value)


def test_chunk_missing_from_shard_index(copy):
    """An index entry marked absent (with a valid crc32c) would read as zeros in plain zarr."""
    shard = expert_store.quant_shard_path(copy, 1, "down", "int8", "values")
    experts, expert = 16, 9
    with open(shard, "rb") as f:
        data = bytearray(f.read())
    start = len(data) - experts * 16 - 4
    index = bytearray(data[start:-4])
    index[expert * 16:(expert + 1) * 16] = b"\xff" * 16
    data[start:] = index + _crc32c(bytes(index)).to_bytes(4, "little")
    with open(shard, "wb") as f:
        f.write(data)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(copy).experts_at("int8")
    msg = str(info.value)
    assert shard in msg and "missing" in msg
    _assert_names(msg, 1, expert, "down", "int8")
    with pytest.raises(CheckpointError, match="missing"):
        expert_store.read_quantized_expert(copy, 1, "down", "int8", expert)
    expert_store.read_quantized_expert(copy, 1, "down", "int8", expert - 1)


def test_missing_quantized_array(copy):
    path = expert_store.quant_path(copy, 1, "down", "int8", "scale")
    shutil.rmtree(path)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(copy).experts_at("int8")
    msg = str(info.value)
    assert path in msg and "missing" in msg and re.search(r"\blayer 1\b", msg)


def test_group_in_config_disagreeing_with_arrays(copy):
    path = os.path.join(copy, "config.json")
    with open(path) as f:
        d = json.load(f)
    d["precisions"]["int4"]["groups"]["down"] = 8
    with open(path, "w") as f:
        json.dump(d, f)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(copy).experts_at("int4")
    assert "down" in str(info.value) and "int4" in str(info.value)
    d["precisions"]["int5"] = d["precisions"].pop("int4")
    with open(path, "w") as f:
        json.dump(d, f)
    with pytest.raises(CheckpointError, match="int5"):
        checkpoint.load(copy)


@pytest.mark.slow
def test_add_precisions_to_existing_checkpoint(tiny, tmp_path):
    model, gate_up, down = tiny
    out = str(tmp_path / "ckpt")
    checkpoint.save_model(out, model, gate_up, down, compression="blosc")
    present = convert_add_precisions(out, "int4,int2", group_size=64, calibration="search")
    assert list(present) == ["native", "int4", "int2"]
    # Same compression as the native experts.
    assert expert_store.compression_of(out, 0, "gate_up") == "blosc"
    with open(os.path.join(expert_store.quant_path(out, 0, "gate_up", "int4", "values"),
                           "zarr.json")) as f:
        assert "blosc" in f.read()
    ck = checkpoint.load(out)
    assert ck.precisions["int4"]["groups"] == {"gate_up": 64, "down": 32}
    _assert_quantized_as(ck, model.cfg, gate_up, down, "int2", 64, "search")
    # Adding another keeps the ones present; re-adding replaces.
    present = checkpoint.add_precisions(out, ["int8"], calibration="minmax")
    assert list(present) == ["native", "int8", "int4", "int2"]
    present = checkpoint.add_precisions(out, ["int4"], group_size=16, calibration="hqq")
    assert present["int4"]["calibration"] == "hqq"
    assert present["int4"]["groups"] == {"gate_up": 16, "down": 16}
    ck = checkpoint.load(out)
    _assert_quantized_as(ck, model.cfg, gate_up, down, "int4", 16, "hqq")
    _assert_quantized_as(ck, model.cfg, gate_up, down, "int2", 64, "search")  # kept
    # Native experts untouched.
    for layer in model.cfg.moe_layers:
        np.testing.assert_array_equal(np.asarray(ck.host_gate_up[layer]),
                                      np.asarray(gate_up[layer]))
        np.testing.assert_array_equal(np.asarray(ck.host_down[layer]), np.asarray(down[layer]))


def _assert_quantized_as(ck, cfg, gate_up, down, precision, group_size, calibration):
    """The checkpoint's `precision` experts are `quantize` of the source's: every MoE layer,
    both kinds, every part."""
    gu, dn = ck.experts_at(precision)
    assert set(gu) == set(dn) == set(cfg.moe_layers)
    for layer in cfg.moe_layers:
        for host, src in ((gu, gate_up), (dn, down)):
            got = host[layer].map(np.asarray)
            want = quantize(np.asarray(src[layer]), precision, group_size, calibration)
            assert got.bits == want.bits
            for part in expert_store.PARTS:
                np.testing.assert_array_equal(getattr(got, part), getattr(want, part))


def test_add_precisions_to_a_non_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        convert_add_precisions(str(tmp_path), "int8")


@pytest.mark.parametrize("kwargs,flag,text", [
    (dict(precisions="int8,int3"), "--precisions", "int3"),
    (dict(precisions="int8,int8"), "--precisions", "repeats"),
    (dict(precisions="native"), "--precisions", "native"),
    (dict(precisions="int4", group_size=0), "--group_size", "0"),
    (dict(precisions="int4", group_size="64"), "--group_size", "64"),
    (dict(precisions="int4", calibration="mse"), "--calibration", "mse"),
    (dict(precisions="int4", calibration="int2=search"), "--calibration", "int2"),
    (dict(precisions="int4", calibration="int4=bogus"), "--calibration", "bogus"),
    (dict(precisions="int4", calibration="int4"), "--calibration", "int4"),
    (dict(calibration="search"), "--calibration", "--precisions"),
])
def test_convert_flag_validation(kwargs, flag, text, tmp_path):
    args = dict(precisions=None, group_size=formats.DEFAULT_GROUP_SIZE, calibration=None)
    args.update(kwargs)
    with pytest.raises(ConfigError) as info:
        check_quant_flags(**args)
    assert flag in str(info.value) and text in str(info.value)
    # convert() validates before touching the (here nonexistent) Hugging Face directory.
    with pytest.raises(ConfigError) as info:
        convert(str(tmp_path / "no_hf"), str(tmp_path / "out"), **args)
    assert flag in str(info.value)
    assert not os.path.exists(tmp_path / "out")


def test_convert_flag_parsing():
    assert check_quant_flags("int2, int8", 64, None) == ("int8", "int2")
    assert check_quant_flags(None, 64, None) == ()
    assert checkpoint.resolve_calibrations(("int4", "int2"), "int2=hqq", "c") == {
        "int4": "search", "int2": "hqq"}
    assert checkpoint.resolve_calibrations(("int8",), "minmax", "c") == {"int8": "minmax"}
    with pytest.raises(ConfigError, match="--add_precisions needs --precisions"):
        convert_add_precisions("/nonexistent", None)
