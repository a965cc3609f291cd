"""Parity with Hugging Face transformers, the reference implementation no one here wrote.

Every `tests/parity_configs/*.json` (a transformers config with a `model_type` key) is a case:
a random transformers model is saved with `save_pretrained`, converted by `moejax.convert`,
loaded, and run layer-stepped. Prefill logits must match within 1e-4 of the logit scale, and
greedy decoding with the KV cache must produce the same tokens (and logits) at every step.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest
import torch  # the test extra installs it: a missing torch is a failure, not a skip

from moejax import checkpoint
from moejax.convert import convert
from moejax.families import FAMILIES, family_for_hf
from moejax.models.stepped import ResidentExperts, SteppedDecoder
from moejax.testing import hf_model_from_config_file, save_hf_model

# Every case builds, saves, converts and runs a transformers model: the heavy end of the suite.
pytestmark = pytest.mark.slow

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "parity_configs")
CASES = sorted(glob.glob(os.path.join(CONFIG_DIR, "*.json")))
DECODE_STEPS = 10
TOL = 1e-4


def _original_len(spec: dict) -> int | None:
    rp = spec.get("rope_parameters") or spec.get("rope_scaling") or {}
    if rp.get("rope_type", rp.get("type")) in ("longrope", "su"):
        return int(rp.get("original_max_position_embeddings",
                          spec.get("original_max_position_embeddings")))
    return None


def _hf_greedy(model, prompt: np.ndarray, steps: int):
    """Prefill logits, then greedy decode through the transformers KV cache."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor(prompt), use_cache=True)
        prefill = out.logits.float().numpy()
        cache = out.cache
        tokens, step_logits = [], []
        nxt = int(out.logits[0, -1].argmax())
        for step in range(steps):
            tokens.append(nxt)
            if step == steps - 1:
                break
            out = model(input_ids=torch.tensor([[nxt]]), cache=cache, use_cache=True)
            cache = out.cache
            step_logits.append(out.logits[0, -1].float().numpy())
            nxt = int(out.logits[0, -1].argmax())
    return prefill, tokens, step_logits


def _run_case(config_path: str, tmp_path, prompt_len: int):
    with open(config_path) as f:
        spec = json.load(f)
    hf_model = hf_model_from_config_file(config_path, seed=0)
    hf_dir = save_hf_model(hf_model, str(tmp_path / "hf"))
    out = str(tmp_path / "moejax")
    cfg = convert(hf_dir, out)
    ckpt = checkpoint.load(out)
    decoder = SteppedDecoder(ckpt.model,
                             ResidentExperts.from_host(ckpt.host_gate_up, ckpt.host_down),
                             max_len=prompt_len + DECODE_STEPS)
    prompt = np.random.default_rng(1).integers(0, spec["vocab_size"], (1, prompt_len))
    ours = decoder.generate(prompt, DECODE_STEPS, keep_logits=True)
    ref_prefill, ref_tokens, ref_steps = _hf_greedy(hf_model, prompt, DECODE_STEPS)

    scale = float(np.max(np.abs(ref_prefill)))
    assert scale > 1.0, "weights too small for a meaningful comparison"
    err = float(np.max(np.abs(ours.prefill_logits - ref_prefill)))
    assert err <= TOL * scale, f"prefill logits differ by {err:.3g} (scale {scale:.3g})"
    assert ours.generated_ids[0] == ref_tokens
    assert len(ours.step_logits) == len(ref_steps) > 0
    for step, (a, b) in enumerate(zip(ours.step_logits, ref_steps)):
        err = float(np.max(np.abs(a[0] - b)))
        assert err <= TOL * scale, f"decode step {step} logits differ by {err:.3g}"
    return cfg


@pytest.mark.parametrize("config_path", CASES, ids=[os.path.basename(p)[:-5] for p in CASES])
def test_parity_prefill_and_greedy_decode(config_path, tmp_path):
    with open(config_path) as f:
        spec = json.load(f)
    original = _original_len(spec)
    # At least 16 tokens; past longrope's original length where the config has one.
    prompt_len = max(19, original + 5) if original else 19
    cfg = _run_case(config_path, tmp_path, prompt_len)
    assert cfg.num_moe_layers > 0


LONGROPE_CASES = [p for p in CASES if _original_len(json.load(open(p)))]


@pytest.mark.parametrize("config_path", LONGROPE_CASES,
                         ids=[os.path.basename(p)[:-5] for p in LONGROPE_CASES])
def test_parity_longrope_decode_crosses_original_length(config_path, tmp_path):
    """Prefill below the original length, decode past it: the rotation switches mid-cache."""
    original = _original_len(json.load(open(config_path)))
    _run_case(config_path, tmp_path, prompt_len=original - 4)


def test_parity_cases_cover_every_family():
    families = {family_for_hf(json.load(open(p))).name for p in CASES}
    assert families == set(FAMILIES)
