"""The packed expert layout: one file of page-aligned expert records per MoE layer and precision,
indexed in config.json. It loads bit-identically to the zarr layout of the same model at every
precision, a damaged record is named by file, layer, expert and precision, and `add_precisions`
and `convert --layout=packed` write it."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax import checkpoint
from moejax.checkpoint import CheckpointError, expert_store, packed
from moejax.checkpoint.hf_names import dense_sources
from moejax.checkpoint.params import flat_params
from moejax.convert import convert
from moejax.errors import ConfigError
from moejax.families import config_from_hf, get_family, preset
from moejax.models.decoder import abstract_decoder
from moejax.models.random_init import random_experts
from tests.fuzzing import examples

PRECS = ("int8", "int4", "int2")


def _save(out, cfg, experts, expert_layout, precisions=PRECS, **kw):
    """A checkpoint of random dense parameters and `experts` (no model init: fast)."""
    rng = np.random.default_rng(0)
    dense = {k: rng.standard_normal(v.shape).astype(v.dtype)
             for k, v in flat_params(abstract_decoder(cfg)).items()}
    gate_up, down = experts
    checkpoint.save(out, cfg, dense, ((l, gate_up[l], down[l]) for l in cfg.moe_layers),
                precisions=precisions, group_size=16, calibration="minmax",
                expert_layout=expert_layout, **kw)
    return out


@pytest.fixture(scope="module")
def cfg():
    # H=64, I=32, 16 experts, 4 MoE layers; bfloat16 so ml_dtypes arrays go through the records.
    return dataclasses.replace(preset("olmoe", "tiny"), dtype="bfloat16")


@pytest.fixture(scope="module")
def experts(cfg):
    return random_experts(cfg, seed=1)


@pytest.fixture(scope="module")
def saved(cfg, experts, tmp_path_factory):
    root = tmp_path_factory.mktemp("packed")
    return {kind: _save(str(root / kind), cfg, experts, kind) for kind in checkpoint.LAYOUTS}


@pytest.fixture(scope="module")
def loaded(saved):
    return {kind: checkpoint.load(path) for kind, path in saved.items()}


@pytest.fixture
def copy(saved, tmp_path):
    d = str(tmp_path / "ckpt")
    shutil.copytree(saved["packed"], d)
    return d


def _config(path):
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def _assert_names(msg, path, layer, expert, precision):
    assert path in msg, msg
    assert re.search(rf"\blayer {layer}\b", msg) and re.search(rf"\bexpert {expert}\b", msg), msg
    assert precision in msg, msg


def _assert_same_experts(cfg, got, want):
    """`experts_at` results equal bit for bit: both kinds, every MoE layer, and of quantized
    weights every part (values, scale, zero) and the bit width."""
    assert len(got) == len(want) == 2  # (gate_up, down)
    for got_kind, want_kind in zip(got, want):
        assert set(got_kind) == set(want_kind) == set(cfg.moe_layers)
        for layer in cfg.moe_layers:
            g, w = got_kind[layer], want_kind[layer]
            if hasattr(w, "bits"):
                assert g.bits == w.bits
                pairs = [(getattr(g, part), getattr(w, part)) for part in expert_store.PARTS]
            else:
                pairs = [(g, w)]
            for a, b in pairs:
                a, b = np.asarray(a), np.asarray(b)
                assert a.dtype == b.dtype and a.shape == b.shape, layer
                assert a.tobytes() == b.tobytes(), layer


def _flip(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x5A]))


def test_files_and_index(cfg, saved):
    path = saved["packed"]
    assert checkpoint.expert_layout(path) == "packed" and checkpoint.expert_layout(saved["zarr"]) == "zarr"
    assert "expert_layout" not in _config(saved["zarr"])  # the zarr layout's config is unchanged
    assert checkpoint.read_config(path) == cfg
    assert checkpoint.read_precisions(path) == checkpoint.read_precisions(saved["zarr"])
    assert sorted(os.listdir(os.path.join(path, "experts", "layer_002"))) == [
        f"{p}.packed" for p in sorted(("native", *PRECS))]

    index = _config(path)["expert_layout"]
    assert index["kind"] == "packed" and index["page_bytes"] == 4096
    assert set(index["precisions"]) == {"native", *PRECS}
    native = index["precisions"]["native"]
    assert [(p["kind"], p["part"], p["shape"], p["dtype"]) for p in native["parts"]] == [
        ("gate_up", "weights", [64, 64], "bfloat16"), ("down", "weights", [32, 64], "bfloat16")]
    int2 = index["precisions"]["int2"]["parts"]
    assert [(p["kind"], p["part"]) for p in int2] == [
        (k, part) for k in ("gate_up", "down") for part in ("values", "scale", "zero")]
    assert int2[0]["shape"] == [16, 64] and int2[1]["shape"] == [4, 64]  # 64 rows, 2 bits, g=16
    for p, entry in index["precisions"].items():
        stride = entry["stride"]
        assert stride % 4096 == 0 and entry["parts"][-1]["offset"] < stride
        assert all(part["offset"] % 64 == 0 for part in entry["parts"])
        assert set(entry["checksums"]) == {"0", "1", "2", "3"}
        assert all(len(s) == 16 for s in entry["checksums"].values())
        assert os.path.getsize(packed.file_path(path, 3, p)) == 16 * stride
    # One line per layer's checksums, not one per expert.
    with open(os.path.join(path, "config.json")) as f:
        assert len(re.findall(r'"3": \[\d+(, \d+){15}\]', f.read())) == 4


def test_records_are_raw_bytes(experts, saved):
    """A record is the parts' little-endian bytes at the recorded offsets, zeros elsewhere."""
    record = checkpoint.read_expert_index(saved["packed"]).records["native"]
    layer, expert = 1, 5
    with open(packed.file_path(saved["packed"], layer, "native"), "rb") as f:
        f.seek(expert * record.stride)
        raw = f.read(record.stride)
    gate_up, down = record.parts
    assert raw[gate_up.offset:gate_up.offset + gate_up.nbytes] == \
        experts[0][layer][expert].tobytes()  # little-endian, as this host is
    assert raw[down.offset:down.offset + down.nbytes] == experts[1][layer][expert].tobytes()
    assert set(raw[record.used:]) <= {0}
    assert zlib.crc32(raw[:record.used]) == \
        checkpoint.read_expert_index(saved["packed"]).checksums["native"][layer][expert]


def test_load_is_bit_identical_to_zarr(cfg, experts, loaded):
    z, p = loaded["zarr"], loaded["packed"]
    assert p.expert_index is not None and z.expert_index is None
    for layer in cfg.moe_layers:
        for host_z, host_p, src in ((z.host_gate_up, p.host_gate_up, experts[0]),
                                    (z.host_down, p.host_down, experts[1])):
            a, b = np.asarray(host_z[layer]), np.asarray(host_p[layer])
            assert a.dtype == b.dtype == src[layer].dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes() == src[layer].tobytes()
            assert host_p[layer].sharding.memory_kind == checkpoint.host_memory_kind()
    for precision in PRECS:
        for qz, qp in zip(z.experts_at(precision), p.experts_at(precision)):
            for layer in cfg.moe_layers:
                assert qz[layer].bits == qp[layer].bits
                for part in expert_store.PARTS:
                    a, b = (np.asarray(getattr(q[layer], part)) for q in (qz, qp))
                    assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("kind", ["zarr", "packed"])
def test_load_without_experts_reads_them_on_first_use(cfg, saved, loaded, kind):
    ck = checkpoint.load(saved[kind], read_experts=False)
    assert ck.host_gate_up is None and ck.host_down is None
    gate_up, down = ck.experts_at("native")
    assert ck.host_gate_up is gate_up and ck.experts_at("native")[1] is down
    _assert_same_experts(cfg, (gate_up, down),
                         (loaded[kind].host_gate_up, loaded[kind].host_down))


def test_flipped_byte_names_the_expert(copy):
    index = checkpoint.read_expert_index(copy)
    record = index.records["int4"]
    path = packed.file_path(copy, 0, "int4")
    _flip(path, 11 * record.stride + record.parts[4].offset)  # down's scale
    ck = checkpoint.load(copy)  # native experts are fine; the copy is read on demand
    with pytest.raises(CheckpointError) as info:
        ck.experts_at("int4")
    _assert_names(str(info.value), path, 0, 11, "int4")
    assert "corrupt" in str(info.value)
    ck.experts_at("int2")  # other precisions are unaffected

    record = index.records["native"]
    path = packed.file_path(copy, 2, "native")
    _flip(path, 7 * record.stride + record.parts[1].offset + 3)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(copy)
    _assert_names(str(info.value), path, 2, 7, "native")


def test_flipped_padding_byte_is_harmless(cfg, copy, loaded):
    """The padding after a record's last part is not data (nor checksummed)."""
    record = checkpoint.read_expert_index(copy).records["int8"]
    assert record.stride > record.used
    _flip(packed.file_path(copy, 1, "int8"), 4 * record.stride + record.stride - 1)
    _assert_same_experts(cfg, checkpoint.load(copy).experts_at("int8"),
                         loaded["packed"].experts_at("int8"))


def test_truncated_file_is_named(copy):
    record = checkpoint.read_expert_index(copy).records["native"]
    path = packed.file_path(copy, 3, "native")
    with open(path, "r+b") as f:
        f.truncate(9 * record.stride + 100)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(copy)
    msg = str(info.value)
    assert "truncated" in msg and str(16 * record.stride) in msg
    _assert_names(msg, path, 3, 9, "native")


def test_missing_file_is_named(copy):
    path = packed.file_path(copy, 1, "int2")
    os.remove(path)
    ck = checkpoint.load(copy)  # the native experts are all there
    with pytest.raises(CheckpointError) as info:
        ck.experts_at("int2")
    assert path in str(info.value) and "missing" in str(info.value)


def _swap_offsets(parts: list[dict], a: int, b: int) -> None:
    assert parts[a]["nbytes"] == parts[b]["nbytes"]  # a swap the sizes cannot reveal
    parts[a]["offset"], parts[b]["offset"] = parts[b]["offset"], parts[a]["offset"]


@pytest.mark.parametrize("edit,text", [
    (lambda i: i["precisions"]["int4"]["parts"][0].update(shape=[16, 64]), "parts"),
    (lambda i: i["precisions"]["native"]["checksums"].pop("2"), "checksums"),
    (lambda i: i["precisions"]["native"]["checksums"]["1"].pop(), "checksums"),
    (lambda i: i["precisions"]["int8"].update(stride=1000), "stride"),
    (lambda i: i["precisions"].pop("int2"), "precisions"),
    (lambda i: i["precisions"]["int4"].pop("parts"), "int4"),
    (lambda i: i.update(kind="rows"), "kind"),
    (lambda i: i.update(page_bytes="4k"), "page_bytes"),
    # Two parts of one size swapped (int4 gate_up's scale and zero point): same bytes, same
    # checksums, other weights — refused by where the format puts each part.
    (lambda i: _swap_offsets(i["precisions"]["int4"]["parts"], 1, 2),
     "part gate_up.scale at offset"),
    (lambda i: i["precisions"]["native"].update(
        stride=i["precisions"]["native"]["stride"] + 4096), "stride"),
])
def test_index_disagreeing_with_config(copy, edit, text):
    d = _config(copy)
    edit(d["expert_layout"])
    with open(os.path.join(copy, "config.json"), "w") as f:
        json.dump(d, f)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(copy)
    assert os.path.join(copy, "config.json") in str(info.value) and text in str(info.value)


def test_layout_argument_validation(cfg, experts, tmp_path):
    with pytest.raises(ConfigError, match="expert_layout=packed stores raw bytes"):
        _save(str(tmp_path / "a"), cfg, experts, "packed", compression="blosc")
    with pytest.raises(ConfigError, match="expert_layout='rows'"):
        _save(str(tmp_path / "b"), cfg, experts, "rows")
    # convert() checks --layout before touching the (here nonexistent) Hugging Face directory.
    with pytest.raises(ConfigError, match="--layout"):
        convert(str(tmp_path / "no_hf"), str(tmp_path / "out"), compression="blosc",
                expert_layout="packed")
    assert not os.path.exists(tmp_path / "out")


def test_add_precisions_to_packed(cfg, experts, loaded, tmp_path):
    out = _save(str(tmp_path / "ckpt"), cfg, experts, "packed", precisions=("int8",))
    present = checkpoint.add_precisions(out, "int4,int2", group_size=16, calibration="minmax")
    assert list(present) == ["native", *PRECS]
    assert set(_config(out)["expert_layout"]["precisions"]) == {"native", *PRECS}
    assert not os.path.exists(os.path.join(out, "experts", "layer_000", "gate_up"))  # no zarr
    ck = checkpoint.load(out)
    for precision in PRECS:
        _assert_same_experts(cfg, ck.experts_at(precision),
                             loaded["zarr"].experts_at(precision))
    # Re-adding replaces that precision's records and index entry; the others stay.
    before = _config(out)["expert_layout"]["precisions"]
    present = checkpoint.add_precisions(out, ["int4"], group_size=8, calibration="absmax")
    after = _config(out)["expert_layout"]["precisions"]
    assert present["int4"]["groups"] == {"gate_up": 8, "down": 8}
    assert after["int4"] != before["int4"] and after["int2"] == before["int2"]
    assert after["native"] == before["native"]
    assert checkpoint.load(out).experts_at("int4")[0][0].group_size == 8


def test_crc32_combine_and_ranges():
    @settings(max_examples=examples(40))
    @given(st.binary(max_size=300), st.binary(max_size=300))
    def combine(a, b):
        assert packed.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)

    combine()
    record = packed.Record("native", (), 10 * 4096)
    for split in range(1, 9):
        ranges = record.ranges(split)
        assert ranges[0][0] == 0 and ranges[-1][1] == record.stride and len(ranges) <= split
        assert all(a % 4096 == 0 and b == c for (a, b), (c, _) in zip(ranges, ranges[1:]))
    assert len(packed.Record("native", (), 2 * 4096).ranges(8)) == 2  # whole pages only


def _hf_dir(directory: str) -> str:
    """A Hugging Face directory of the tiny OLMoE preset with random tensors, written with
    safetensors directly (no transformers model to build), experts in the fused form."""
    import safetensors.numpy

    fam = get_family("olmoe")
    cfg = config_from_hf(fam.presets["tiny"])
    rng = np.random.default_rng(2)
    shapes = {k: v.shape for k, v in flat_params(abstract_decoder(cfg)).items()}
    tensors = {name: rng.standard_normal(shapes[path][::-1] if transpose else shapes[path])
               for path, (name, transpose) in dense_sources(cfg).items()}
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.expert_intermediate_size
    for layer in cfg.moe_layers:
        base = f"model.layers.{layer}.{fam.moe_prefix}.experts"
        tensors[f"{base}.gate_up_proj"] = rng.standard_normal((e, 2 * i, h))
        tensors[f"{base}.down_proj"] = rng.standard_normal((e, h, i))
    os.makedirs(directory)
    safetensors.numpy.save_file({k: v.astype(np.float32) for k, v in tensors.items()},
                                os.path.join(directory, "model.safetensors"))
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(fam.presets["tiny"], f)
    return directory


def test_convert_packed_end_to_end(tmp_path):
    """A Hugging Face checkpoint converted with --layout=packed loads as the zarr conversion
    does."""
    hf = _hf_dir(str(tmp_path / "hf"))
    kw = dict(precisions="int4", group_size=16, calibration="minmax")
    convert(hf, str(tmp_path / "zarr"), **kw)
    cfg = convert(hf, str(tmp_path / "packed"), expert_layout="packed", **kw)
    assert checkpoint.expert_layout(str(tmp_path / "packed")) == "packed"
    z, p = checkpoint.load(str(tmp_path / "zarr")), checkpoint.load(str(tmp_path / "packed"))
    for precision in ("native", "int4"):
        _assert_same_experts(cfg, p.experts_at(precision), z.experts_at(precision))


def test_a_copy_in_the_packed_layout_holds_the_same_experts(tmp_path):
    """`copy_in_layout`: the shipped embedded model (zarr) written packed, int4 added."""
    from moejax import bundled

    out = str(tmp_path / "packed")
    checkpoint.copy_in_layout(bundled.EMBEDDED_DIR, out, "packed", precisions=("int4",))
    assert checkpoint.expert_layout(out) == "packed"
    assert list(checkpoint.read_precisions(out)) == ["native", "int4"]
    src, copy = checkpoint.load(bundled.EMBEDDED_DIR), checkpoint.load(out)
    for layer in src.cfg.moe_layers:
        np.testing.assert_array_equal(np.asarray(copy.host_gate_up[layer]),
                                      np.asarray(src.host_gate_up[layer]))
        np.testing.assert_array_equal(np.asarray(copy.host_down[layer]),
                                      np.asarray(src.host_down[layer]))
