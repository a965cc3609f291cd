"""Checkpoint conversion and loading: a clean round trip, and errors that name what is at fault.

A tiny OLMoE model is built with transformers on CPU, saved with `save_pretrained`, converted
with `moejax.convert.convert` and loaded with `moejax.checkpoint.load`; each error test
damages one file (of the Hugging Face input or the moejax output) and checks the message names
that file and the tensor / layer / expert concerned.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy as safetensors_numpy  # the test extra installs these: no silent skips
import torch
import transformers

from moejax import checkpoint
from moejax.checkpoint import CheckpointError, expert_store
from moejax.checkpoint.params import flat_params
from moejax.convert import convert
from moejax.errors import ConfigError
from moejax.families import FAMILIES

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Dimensions of the tiny model (distinct so a swapped axis shows up as a shape error).
VOCAB, HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, EXPERTS, TOP_K = 61, 24, 20, 2, 4, 2, 5, 2
HEAD_DIM = HIDDEN // HEADS


def tiny_hf_model():
    cfg = transformers.AutoConfig.for_model(
        "olmoe", vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        num_experts=EXPERTS, num_experts_per_tok=TOP_K, eos_token_id=2, pad_token_id=1,
        bos_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    # Every parameter random (norm scales included) so any mix-up of tensors changes values.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def hf_model():
    return tiny_hf_model()


@pytest.fixture(scope="module")
def hf_dir(hf_model, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("hf"))
    hf_model.save_pretrained(d)
    assert os.path.exists(os.path.join(d, "model.safetensors"))
    return d


@pytest.fixture(scope="module")
def hf_tensors(hf_dir):
    return safetensors_numpy.load_file(os.path.join(hf_dir, "model.safetensors"))


@pytest.fixture(scope="module")
def converted(hf_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("converted") / "ckpt")
    convert(hf_dir, out)
    return out


@pytest.fixture
def hf_copy(hf_dir, tmp_path):
    d = str(tmp_path / "hf")
    shutil.copytree(hf_dir, d)
    return d


@pytest.fixture
def out_copy(converted, tmp_path):
    d = str(tmp_path / "ckpt")
    shutil.copytree(converted, d)
    return d


def _rewrite_safetensors(hf_dir: str, edit) -> None:
    """Rewrites `hf_dir/model.safetensors` with `edit(tensors)` applied (in place)."""
    path = os.path.join(hf_dir, "model.safetensors")
    tensors = dict(safetensors_numpy.load_file(path))
    edit(tensors)
    os.remove(path)
    safetensors_numpy.save_file(tensors, path, metadata={"format": "pt"})


def _edit_json(path: str, **changes) -> None:
    with open(path) as f:
        d = json.load(f)
    d.update(changes)
    with open(path, "w") as f:
        json.dump(d, f)


def _expert_name(layer: int, expert: int, proj: str) -> str:
    return f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"


def _assert_layer_expert(msg: str, layer: int, expert: int) -> None:
    assert re.search(rf"\blayer {layer}\b", msg), msg
    assert re.search(rf"\bexpert {expert}\b", msg), msg


# -- a clean conversion -------------------------------------------------------------------------


def test_clean_conversion_loads_with_hf_weights(converted, hf_tensors):
    ck = checkpoint.load(converted)
    cfg = ck.cfg
    assert (cfg.family, cfg.vocab_size, cfg.hidden_size, cfg.num_layers) == (
        "olmoe", VOCAB, HIDDEN, LAYERS)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (HEADS, KV_HEADS, HEAD_DIM)
    assert (cfg.num_experts, cfg.top_k, cfg.expert_intermediate_size) == (EXPERTS, TOP_K, INTER)
    assert cfg.moe_layers == tuple(range(LAYERS)) and cfg.qk_norm
    assert set(ck.host_gate_up) == set(ck.host_down) == set(range(LAYERS))
    for layer in range(LAYERS):
        gate_up = np.asarray(ck.host_gate_up[layer])
        down = np.asarray(ck.host_down[layer])
        assert gate_up.shape == (EXPERTS, HIDDEN, 2 * INTER)
        assert down.shape == (EXPERTS, INTER, HIDDEN)
        for e in range(EXPERTS):
            g = hf_tensors[_expert_name(layer, e, "gate_proj")]
            u = hf_tensors[_expert_name(layer, e, "up_proj")]
            d = hf_tensors[_expert_name(layer, e, "down_proj")]
            np.testing.assert_array_equal(gate_up[e], np.concatenate([g.T, u.T], axis=1))
            np.testing.assert_array_equal(down[e], d.T)
            # The single-chunk reader agrees with the whole-layer read.
            np.testing.assert_array_equal(
                expert_store.read_expert(converted, layer, "gate_up", e), gate_up[e])
            np.testing.assert_array_equal(
                expert_store.read_expert(converted, layer, "down", e), down[e])

    # Dense parameters, written out by hand (HF linear weights are [out, in]).
    params = {k: np.asarray(v) for k, v in flat_params(ck.model).items()}
    want = {"embed.embedding": hf_tensors["model.embed_tokens.weight"],
            "final_norm.scale": hf_tensors["model.norm.weight"],
            "lm_head.kernel": hf_tensors["lm_head.weight"].T}
    for i in range(LAYERS):
        hp = f"model.layers.{i}"
        want[f"layers.{i}.input_norm.scale"] = hf_tensors[f"{hp}.input_layernorm.weight"]
        want[f"layers.{i}.post_norm.scale"] = hf_tensors[f"{hp}.post_attention_layernorm.weight"]
        for p in "qkvo":
            want[f"layers.{i}.attn.{p}.kernel"] = hf_tensors[f"{hp}.self_attn.{p}_proj.weight"].T
        want[f"layers.{i}.attn.q_norm.scale"] = hf_tensors[f"{hp}.self_attn.q_norm.weight"]
        want[f"layers.{i}.attn.k_norm.scale"] = hf_tensors[f"{hp}.self_attn.k_norm.weight"]
        want[f"layers.{i}.router.proj.kernel"] = hf_tensors[f"{hp}.mlp.gate.weight"].T
    assert set(params) == set(want)
    for k in want:
        np.testing.assert_array_equal(params[k], want[k], err_msg=k)
    assert ck.tokenizer_dir is not None  # generation_config.json is copied


def test_dtype_override_and_bad_dtype(hf_dir, tmp_path, hf_tensors):
    out = str(tmp_path / "bf16")
    cfg = convert(hf_dir, out, dtype="bfloat16")
    assert cfg.dtype == "bfloat16"
    g = expert_store.read_expert(out, 1, "down", 3)
    assert g.dtype.name == "bfloat16"
    np.testing.assert_array_equal(
        np.asarray(g, np.float32),
        hf_tensors[_expert_name(1, 3, "down_proj")].T.astype(g.dtype).astype(np.float32))
    with pytest.raises(ConfigError, match=r"float64"):
        convert(hf_dir, str(tmp_path / "f64"), dtype="float64")


# -- errors in the Hugging Face input -----------------------------------------------------------


def test_no_config_json(hf_copy, tmp_path):
    os.remove(os.path.join(hf_copy, "config.json"))
    with pytest.raises(CheckpointError) as info:
        convert(hf_copy, str(tmp_path / "out"))
    assert os.path.join(hf_copy, "config.json") in str(info.value)
    assert "missing" in str(info.value)


def test_config_json_not_json(hf_copy, tmp_path):
    path = os.path.join(hf_copy, "config.json")
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.raises(CheckpointError) as info:
        convert(hf_copy, str(tmp_path / "out"))
    assert path in str(info.value) and "JSON" in str(info.value)


def test_no_safetensors(hf_copy, tmp_path):
    os.remove(os.path.join(hf_copy, "model.safetensors"))
    with pytest.raises(CheckpointError) as info:
        convert(hf_copy, str(tmp_path / "out"))
    msg = str(info.value)
    assert hf_copy in msg
    assert "model.safetensors" in msg and "model.safetensors.index.json" in msg
    assert not os.path.exists(os.path.join(tmp_path, "out", "config.json"))


@pytest.mark.parametrize("name", [
    _expert_name(1, 3, "up_proj"),
    _expert_name(0, 0, "down_proj"),
    "model.layers.1.self_attn.k_norm.weight",
    "lm_head.weight",
])
def test_missing_tensor_is_named(hf_copy, tmp_path, name):
    _rewrite_safetensors(hf_copy, lambda t: t.pop(name))
    out = str(tmp_path / "out")
    with pytest.raises(CheckpointError) as info:
        convert(hf_copy, out)
    msg = str(info.value)
    assert repr(name) in msg and "missing" in msg
    assert hf_copy in msg
    # An incomplete conversion is not marked complete.
    assert not os.path.exists(os.path.join(out, "config.json"))


def test_missing_config_key_is_named(hf_copy, tmp_path):
    path = os.path.join(hf_copy, "config.json")
    with open(path) as f:
        d = json.load(f)
    del d["num_experts_per_tok"]
    with open(path, "w") as f:
        json.dump(d, f)
    with pytest.raises(CheckpointError) as info:
        convert(hf_copy, str(tmp_path / "out"))
    assert path in str(info.value) and "num_experts_per_tok" in str(info.value)


def test_expert_tensor_wrong_shape(hf_copy, tmp_path):
    name = _expert_name(1, 2, "gate_proj")
    bad = (INTER, HIDDEN - 1)

    def edit(t):
        t[name] = np.zeros(bad, np.float32)

    _rewrite_safetensors(hf_copy, edit)
    with pytest.raises(CheckpointError) as info:
        convert(hf_copy, str(tmp_path / "out"))
    msg = str(info.value)
    assert repr(name) in msg
    assert str(bad) in msg and str((INTER, HIDDEN)) in msg


def test_fused_expert_tensor_wrong_shape(hf_copy, tmp_path, hf_tensors):
    """transformers' fused in-memory form is also read; a bad shape there is named too."""
    base = "model.layers.0.mlp.experts"

    def edit(t):
        for layer in range(LAYERS):
            b = f"model.layers.{layer}.mlp.experts"
            g = np.stack([t.pop(f"{b}.{e}.gate_proj.weight") for e in range(EXPERTS)])
            u = np.stack([t.pop(f"{b}.{e}.up_proj.weight") for e in range(EXPERTS)])
            d = np.stack([t.pop(f"{b}.{e}.down_proj.weight") for e in range(EXPERTS)])
            t[f"{b}.gate_up_proj"] = np.concatenate([g, u], axis=1)  # [E, 2I, H]
            t[f"{b}.down_proj"] = d  # [E, H, I]
        t[f"{base}.down_proj"] = t[f"{base}.down_proj"][:, :, :-1].copy()

    _rewrite_safetensors(hf_copy, edit)
    with pytest.raises(CheckpointError) as info:
        convert(hf_copy, str(tmp_path / "out"))
    msg = str(info.value)
    assert repr(f"{base}.down_proj") in msg
    assert str((EXPERTS, HIDDEN, INTER - 1)) in msg and str((EXPERTS, HIDDEN, INTER)) in msg


def test_fused_experts_convert(hf_copy, tmp_path, hf_tensors):
    """The fused form converts to the same experts as the per-expert names."""
    def edit(t):
        for layer in range(LAYERS):
            b = f"model.layers.{layer}.mlp.experts"
            g = np.stack([t.pop(f"{b}.{e}.gate_proj.weight") for e in range(EXPERTS)])
            u = np.stack([t.pop(f"{b}.{e}.up_proj.weight") for e in range(EXPERTS)])
            d = np.stack([t.pop(f"{b}.{e}.down_proj.weight") for e in range(EXPERTS)])
            t[f"{b}.gate_up_proj"] = np.concatenate([g, u], axis=1)
            t[f"{b}.down_proj"] = d

    _rewrite_safetensors(hf_copy, edit)
    out = str(tmp_path / "out")
    convert(hf_copy, out)
    for layer, e in [(0, 0), (1, 4)]:
        gu = expert_store.read_expert(out, layer, "gate_up", e)
        g = hf_tensors[_expert_name(layer, e, "gate_proj")]
        u = hf_tensors[_expert_name(layer, e, "up_proj")]
        np.testing.assert_array_equal(gu, np.concatenate([g.T, u.T], axis=1))
        np.testing.assert_array_equal(expert_store.read_expert(out, layer, "down", e),
                                      hf_tensors[_expert_name(layer, e, "down_proj")].T)


def test_dense_tensor_wrong_shape_names_tensor(hf_copy, tmp_path):
    name = "model.layers.0.self_attn.k_proj.weight"  # HF [out=12, in=24]
    bad = (KV_HEADS * HEAD_DIM, HIDDEN - 1)

    def edit(t):
        t[name] = np.zeros(bad, np.float32)

    _rewrite_safetensors(hf_copy, edit)
    with pytest.raises(CheckpointError) as info:
        convert(hf_copy, str(tmp_path / "out"))
    msg = str(info.value)
    assert repr(name) in msg and "shape" in msg
    # Both shapes, in either orientation (the converter compares the transposed kernel).
    assert str(bad) in msg or str(bad[::-1]) in msg
    good = (KV_HEADS * HEAD_DIM, HIDDEN)
    assert str(good) in msg or str(good[::-1]) in msg


def test_dense_tensor_wrong_shape_reports_file_shape(hf_copy, tmp_path):
    name = "model.layers.0.self_attn.k_proj.weight"
    bad = (KV_HEADS * HEAD_DIM, HIDDEN - 1)

    def edit(t):
        t[name] = np.zeros(bad, np.float32)

    _rewrite_safetensors(hf_copy, edit)
    with pytest.raises(CheckpointError) as info:
        convert(hf_copy, str(tmp_path / "out"))
    assert f"{name!r} has shape {bad}" in str(info.value)


def test_unknown_model_type(hf_copy, tmp_path):
    _edit_json(os.path.join(hf_copy, "config.json"), model_type="notamoe")
    with pytest.raises((CheckpointError, ConfigError)) as info:
        convert(hf_copy, str(tmp_path / "out"))
    msg = str(info.value)
    assert "'notamoe'" in msg
    known = [t for f in FAMILIES.values() for t in f.hf_model_types]
    assert len(known) >= 4
    for t in known:
        assert repr(t) in msg, (t, msg)


def test_sharded_checkpoint_converts_identically(hf_model, converted, tmp_path):
    sharded = str(tmp_path / "hf_sharded")
    hf_model.save_pretrained(sharded, max_shard_size="20KB")
    shards = sorted(f for f in os.listdir(sharded) if f.endswith(".safetensors"))
    assert os.path.exists(os.path.join(sharded, "model.safetensors.index.json"))
    assert not os.path.exists(os.path.join(sharded, "model.safetensors"))
    assert len(shards) > 1
    out = str(tmp_path / "out")
    convert(sharded, out)
    a, b = checkpoint.load(converted), checkpoint.load(out)
    assert a.cfg == b.cfg
    pa, pb = flat_params(a.model), flat_params(b.model)
    assert set(pa) == set(pb)
    for k in pa:
        np.testing.assert_array_equal(np.asarray(pa[k]), np.asarray(pb[k]), err_msg=k)
    for layer in range(LAYERS):
        np.testing.assert_array_equal(np.asarray(a.host_gate_up[layer]),
                                      np.asarray(b.host_gate_up[layer]))
        np.testing.assert_array_equal(np.asarray(a.host_down[layer]),
                                      np.asarray(b.host_down[layer]))


def test_sharded_checkpoint_missing_shard(hf_model, tmp_path):
    sharded = str(tmp_path / "hf_sharded")
    hf_model.save_pretrained(sharded, max_shard_size="20KB")
    with open(os.path.join(sharded, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    assert len(files) > 1
    victim = os.path.join(sharded, files[-1])
    os.remove(victim)
    with pytest.raises(CheckpointError) as info:
        convert(sharded, str(tmp_path / "out"))
    msg = str(info.value)
    assert victim in msg and "missing" in msg


def test_truncated_safetensors(hf_copy, tmp_path):
    path = os.path.join(hf_copy, "model.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(CheckpointError) as info:
        convert(hf_copy, str(tmp_path / "out"))
    msg = str(info.value)
    assert path in msg and "truncated" in msg


# -- errors in the moejax checkpoint ------------------------------------------------------------


@pytest.mark.parametrize("layer,kind,expert", [(1, "gate_up", 3), (0, "down", 0), (1, "down", 4)])
def test_flipped_byte_in_expert_chunk(out_copy, layer, kind, expert):
    chunk = os.path.join(out_copy, "experts", f"layer_{layer:03d}", kind, "c", str(expert),
                         "0", "0")
    assert chunk == expert_store.chunk_path(out_copy, layer, kind, expert, 3)
    with open(chunk, "r+b") as f:
        data = bytearray(f.read())
        mid = len(data) // 2
        data[mid] ^= 0x5A
        f.seek(0)
        f.write(data)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(out_copy)
    msg = str(info.value)
    assert chunk in msg, msg
    _assert_layer_expert(msg, layer, expert)
    assert kind in msg
    # The single-expert read names the same chunk; its neighbours still read fine.
    with pytest.raises(CheckpointError) as info:
        expert_store.read_expert(out_copy, layer, kind, expert)
    assert chunk in str(info.value)
    _assert_layer_expert(str(info.value), layer, expert)
    other = (expert + 1) % EXPERTS
    expert_store.read_expert(out_copy, layer, kind, other)


@pytest.mark.parametrize("layer,kind,expert", [(0, "gate_up", 2), (1, "down", 1)])
def test_deleted_expert_chunk(out_copy, layer, kind, expert):
    chunk = expert_store.chunk_path(out_copy, layer, kind, expert, 3)
    os.remove(chunk)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(out_copy)
    msg = str(info.value)
    assert chunk in msg and "missing" in msg
    _assert_layer_expert(msg, layer, expert)


def test_deleted_expert_array(out_copy):
    path = os.path.join(out_copy, "experts", "layer_001", "down")
    shutil.rmtree(path)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(out_copy)
    assert path in str(info.value)
    assert re.search(r"\blayer 1\b", str(info.value))


def test_deleted_config_json(out_copy):
    os.remove(os.path.join(out_copy, "config.json"))
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(out_copy)
    assert os.path.join(out_copy, "config.json") in str(info.value)


def test_invalid_config_json(out_copy):
    path = os.path.join(out_copy, "config.json")
    _edit_json(path, not_a_field=3)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(out_copy)
    assert path in str(info.value) and "not_a_field" in str(info.value)


def test_deleted_dense(out_copy):
    path = os.path.join(out_copy, "dense")
    shutil.rmtree(path)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(out_copy)
    assert os.path.abspath(path) in str(info.value)


def test_config_with_other_hidden_size(out_copy):
    _edit_json(os.path.join(out_copy, "config.json"), hidden_size=HIDDEN + 8)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(out_copy)
    msg = str(info.value)
    assert os.path.abspath(os.path.join(out_copy, "dense")) in msg
    m = re.search(r"is \(([\d, ]+)\) float32, the config implies \(([\d, ]+)\) float32", msg)
    assert m, msg
    stored = [int(v) for v in m.group(1).split(",") if v.strip()]
    implied = [int(v) for v in m.group(2).split(",") if v.strip()]
    assert HIDDEN in stored and HIDDEN + 8 in implied and HIDDEN + 8 not in stored


def test_config_with_other_expert_size(out_copy):
    """Dense parameters of an OLMoE model do not depend on the expert size: the expert store's
    own shape check must catch it."""
    _edit_json(os.path.join(out_copy, "config.json"), expert_intermediate_size=INTER + 2)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(out_copy)
    msg = str(info.value)
    assert os.path.join(out_copy, "experts", "layer_000", "gate_up") in msg
    assert str((EXPERTS, HIDDEN, 2 * INTER)) in msg
    assert str((EXPERTS, HIDDEN, 2 * INTER + 4)) in msg


# -- the command line ---------------------------------------------------------------------------


def _cli(hf: str, out: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, "-m", "moejax.convert", f"--hf_dir={hf}", f"--out={out}"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_cli_success_and_error(hf_copy, tmp_path):
    out = str(tmp_path / "out")
    ok = _cli(hf_copy, out)
    assert ok.returncode == 0, ok.stderr
    assert "converted olmoe" in ok.stdout
    ck = checkpoint.load(out)
    assert ck.cfg.num_experts == EXPERTS

    path = os.path.join(hf_copy, "model.safetensors")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    bad = _cli(hf_copy, str(tmp_path / "out2"))
    assert bad.returncode != 0
    assert "error:" in bad.stderr and path in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_failed_reconversion_does_not_leave_a_loadable_mix(out_copy, hf_copy):
    def edit(t):
        name = _expert_name(0, 0, "gate_proj")
        t[name] = t[name] * 2  # layer 0 differs from what out_copy holds
        t.pop(_expert_name(1, 3, "up_proj"))  # and layer 1 cannot be converted

    _rewrite_safetensors(hf_copy, edit)
    with pytest.raises(CheckpointError):
        convert(hf_copy, out_copy)
    with pytest.raises(CheckpointError):
        checkpoint.load(out_copy)
