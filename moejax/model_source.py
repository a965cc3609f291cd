"""Loads the model a run names (`moejax.run_spec.ModelSpec`): its decoder, its host-resident
experts and a tokenizer."""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import numpy as np

from moejax import bundled, checkpoint
from moejax.errors import ConfigError
from moejax.families import preset
from moejax.model_config import ModelConfig
from moejax.models import MoEDecoder, random_model
from moejax.quant import formats, quantize
from moejax.run_spec import ModelSpec, RunSpec
from moejax.tokenizer import Tokenizer, load_tokenizer


@dataclasses.dataclass
class LoadedModel:
    """A model, its experts in host memory, and its tokenizer.

    `host_gate_up` / `host_down` are the native experts; `experts_at(precision)` gives them at
    any precision the source has (a checkpoint's quantized copies, read on first use; a
    random-weight preset quantizes its experts in memory), and `precision_bytes()` the bytes of
    one expert at each of those precisions (without reading them)."""

    cfg: ModelConfig
    model: MoEDecoder
    # Per MoE layer, in host memory (pinned where possible); None until read, and once handed
    # over (`take_experts`): read them through `experts_at`.
    host_gate_up: dict[int, jax.Array] | None
    host_down: dict[int, jax.Array] | None
    tokenizer: Tokenizer
    source: str  # a checkpoint path (the embedded model's too), or "preset:<family>/<name>"
    # Quantized experts of a precision, (gate_up, down) per MoE layer in host memory.
    quantized: Callable[[str], tuple[dict, dict]] | None = None
    # Quantization group length per weight kind and precision: {"int4": {"gate_up": g, ...}}.
    groups: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    # The checkpoint directory the experts are read from ("" for weights drawn in memory).
    path: str = ""
    # Drops the source's host copy of a precision's experts (None: it cannot read them again).
    forget: Callable[[str], None] | None = None
    # Other host-memory forms of its experts, built once by a consumer and shared by every
    # runtime built from this model (copy_stream's records: `moejax.serving.build`).
    shared: dict = dataclasses.field(default_factory=dict, repr=False)
    # The native experts as numpy arrays, where the source keeps them (weights drawn in
    # memory, `in_memory`).
    host_numpy: tuple[dict, dict] | None = dataclasses.field(default=None, repr=False)

    @property
    def precisions(self) -> tuple[str, ...]:
        return ("native", *(p for p in formats.QUANTIZED if p in self.groups))

    def experts_at(self, precision: str) -> tuple[dict, dict]:
        if precision == "native":
            if self.host_gate_up is None:  # loaded without them, or handed over: read them
                self.host_gate_up, self.host_down = self.quantized("native")
            return self.host_gate_up, self.host_down
        if precision not in self.groups or self.quantized is None:
            raise ConfigError(f"{self.source} has no {precision} experts (it has "
                              f"{list(self.precisions)}); add them with `python -m "
                              f"moejax.convert --out=CKPT --add_precisions "
                              f"--precisions={precision}`")
        return self.quantized(precision)

    def take_experts(self, precision: str) -> tuple[dict, dict]:
        """`experts_at(precision)`, handed over to a caller that keeps them in another form
        (copy_stream's per-expert records) and may empty the dicts as it goes: a source that
        can read them again (a checkpoint) forgets its copy, so the experts are held once,
        and a later `experts_at` reads them from disk; weights drawn in memory are kept, and
        the caller gets copies of the dicts (it frees nothing, and changes nothing here) — of
        the numpy arrays the native experts were drawn as, where they are kept: reading a
        bfloat16 host table with numpy leaves a host copy that JAX keeps with the table
        (DESIGN "Records")."""
        if self.forget is None:
            if precision == "native" and self.host_numpy is not None:
                return dict(self.host_numpy[0]), dict(self.host_numpy[1])
            return tuple(dict(t) for t in self.experts_at(precision))
        gate_up, down = self.experts_at(precision)
        if precision == "native":
            self.host_gate_up = self.host_down = None
        self.forget(precision)
        return gate_up, down

    def precision_bytes(self) -> dict[str, int]:
        """Bytes of one routed expert at each precision the source has."""
        h, i = self.cfg.hidden_size, self.cfg.expert_intermediate_size
        itemsize = np.dtype(self.cfg.dtype).itemsize
        out = {"native": self.cfg.expert_bytes}
        for p, g in self.groups.items():
            out[p] = (formats.matrix_bytes(h, 2 * i, p, g["gate_up"], itemsize) +
                      formats.matrix_bytes(i, h, p, g["down"], itemsize))
        return out


EMBEDDED, EMBEDDED_DIR = bundled.EMBEDDED, bundled.EMBEDDED_DIR


def embedded_config() -> ModelConfig:
    """The embedded model's shape, without loading its weights."""
    return checkpoint.read_config(EMBEDDED_DIR)


def load_model(m: ModelSpec, read_experts: bool = True) -> LoadedModel:
    """The model `m` names (checked when the job resolved it: `moejax.jobs.specs.check_model`).
    `read_experts=False`: a checkpoint's experts stay on storage (the disk tier reads them
    one by one); `experts_at` still reads a whole precision when a job asks for it."""
    if m.checkpoint or m.preset == EMBEDDED:
        ck = checkpoint.load(m.checkpoint or EMBEDDED_DIR, read_experts=read_experts)
        tok = load_tokenizer(ck.tokenizer_dir, ck.cfg.vocab_size)
        groups = {p: dict(info["groups"]) for p, info in ck.precisions.items() if p != "native"}
        return LoadedModel(ck.cfg, ck.model, ck.host_gate_up, ck.host_down, tok, ck.path,
                           ck.experts_at, groups, ck.path, ck.forget_experts)
    width = m.width
    cfg = preset(m.family, m.preset, width)
    name = f"{m.family}/{m.preset}" + (f" at width {width}" if width else "")
    if cfg.total_expert_bytes > 2 ** 30:
        raise ConfigError(
            f"preset {name} has {cfg.total_expert_bytes / 2**30:.1f} GiB of experts; random "
            "weights are only drawn for CPU-sized presets: convert a checkpoint and pass "
            "--config.model.checkpoint, or narrow the preset with --config.model.width=N")
    model, gate_up, down = random_model(cfg, m.seed)
    return in_memory(cfg, model, gate_up, down, load_tokenizer(None, cfg.vocab_size),
                     f"preset:{m.family}/{m.preset}" + (f"@width={width}" if width else ""))


def load_model_for(run: RunSpec) -> LoadedModel:
    """The run's model; with a host tier (`cache.host_capacity_frac` below 1, or
    `cache.host_bytes`) its experts are not read at start."""
    return load_model(run.model, read_experts=not (run.cache.enabled and run.cache.host_tier))


def in_memory(cfg: ModelConfig, model: MoEDecoder, gate_up: dict, down: dict,
              tokenizer: Tokenizer | None = None, source: str = "in-memory") -> LoadedModel:
    """A `LoadedModel` of weights already in memory (random presets, tests): the native
    experts go to host memory, and every quantized precision is available, quantized on first
    use with the default group size and calibration."""
    gate_up = {l: np.asarray(v) for l, v in gate_up.items()}
    down = {l: np.asarray(v) for l, v in down.items()}
    g = formats.DEFAULT_GROUP_SIZE
    groups = {p: {"gate_up": formats.group_size_for(cfg.hidden_size, g),
                  "down": formats.group_size_for(cfg.expert_intermediate_size, g)}
              for p in formats.QUANTIZED}

    @functools.cache
    def quantized(precision: str) -> tuple[dict, dict]:
        def at(tables):
            return {l: quantize(w, precision, g).map(checkpoint.to_host) for l, w in tables.items()}
        return at(gate_up), at(down)

    return LoadedModel(cfg, model, {l: checkpoint.to_host(v) for l, v in gate_up.items()},
                       {l: checkpoint.to_host(v) for l, v in down.items()},
                       tokenizer or load_tokenizer(None, cfg.vocab_size), source, quantized,
                       groups, host_numpy=(gate_up, down))
