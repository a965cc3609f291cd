"""Layer-stepped execution: the seam where the expert cache runtime plugs in.

Per MoE layer, two jitted steps, each compiled once and shared by every layer (weights are
arguments, shapes are static, the KV cache is preallocated and donated):

1. `attention_router_step`: attention, then the router. Returns the gate outputs — top-k ids,
   their weights, the full router probabilities, and the speculative scores of the next
   `lookahead` MoE layers' gates applied to this layer's hidden state.
2. `experts_step`: the routed experts as one grouped matmul over a given pool of expert weights
   (plus Qwen's shared expert), added to the residual stream.

Between the two, an `ExpertSource` (`moejax/seam.py`) turns the gate outputs into the pool and
the slot of each expert: `ResidentExperts` holds every expert on the device; the cache runtime
holds a few.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import weakref
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import io_callback

from moejax.model_config import GATE_PATHS
from moejax.models.attention import KVCache
from moejax.models.decoder import MoEDecoder
from moejax.models.experts import ExpertPool, combine, expert_outputs, moe_ffn, pool_slots
from moejax.models.layers import norm
from moejax.models.router import route
from moejax.quant import QuantizedWeights
from moejax.seam import ExpertSource, ExpertWave, GateOutputs, Rewind


class ResidentExperts:
    """Every expert of every layer on the device: the reference the cache must reproduce.

    At a quantized precision each layer's experts are one packed pool (`QuantizedWeights`),
    dequantized inside the experts step exactly as the cache's slot pools are, so the cached
    model at precision P reproduces this one at P."""

    def __init__(self, gate_up: dict[int, ExpertPool], down: dict[int, ExpertPool]):
        self.gate_up = {l: _as_pool_arg(v) for l, v in gate_up.items()}
        self.down = {l: _as_pool_arg(v) for l, v in down.items()}
        num_experts = pool_slots(next(iter(gate_up.values())))
        self.identity = jnp.arange(num_experts, dtype=jnp.int32)

    @classmethod
    def from_host(cls, host_gate_up: dict[int, ExpertPool],
                  host_down: dict[int, ExpertPool]) -> "ResidentExperts":
        on_device = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="device")
        put = functools.partial(jax.device_put, device=on_device)
        return cls({k: jax.tree.map(put, v) for k, v in host_gate_up.items()},
                   {k: jax.tree.map(put, v) for k, v in host_down.items()})

    def begin_pass(self, tokens: int, position: int) -> None:
        pass

    def experts_for(self, gate: GateOutputs) -> Iterator[ExpertWave]:
        yield ExpertWave(self.gate_up[gate.layer], self.down[gate.layer], self.identity,
                         gate.ids, gate.weights)

    def end_pass(self) -> None:
        pass

    def sync(self) -> None:
        pass


def _as_pool_arg(pool: ExpertPool):
    """A native pool is passed as the array itself, a quantized one as a one-pool tuple (the
    experts step's `ExpertPools`)."""
    return (pool,) if isinstance(pool, QuantizedWeights) else pool


# ---------------------------------------------------------------------------------------------
# Jitted steps. `graphdef` and `cfg` are static; all layers share one compilation.


class Static:
    """A static jit argument whose hash is computed once. jit hashes static arguments on every
    call, and hashing an NNX graphdef walks the whole module graph (~0.2 ms per call on CPU:
    half the host time of a tiny decode step). Equal values are deduplicated into one instance
    so the cache lookup's equality check is an identity check.

    The intern table holds its instances weakly: an instance lives as long as something (a
    decoder, jit's own cache) refers to it, and nothing here keeps a decoder alive. Values must
    not refer to a decoder or its arrays (a graphdef or a config, not a bound method)."""

    __slots__ = ("value", "hash_value", "__weakref__")
    _interned: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()

    def __new__(cls, value):
        key = (type(value), value)
        inst = cls._interned.get(key)
        if inst is None:
            inst = super().__new__(cls)
            inst.value = value
            inst.hash_value = hash(key)
            cls._interned[key] = inst
        return inst

    def __hash__(self) -> int:
        return self.hash_value

    def __eq__(self, other) -> bool:
        return self is other or (isinstance(other, Static) and self.value == other.value)


# The io_callback gate path's mailbox: the hooked router step appends its gate outputs here and
# `SteppedDecoder.forward` pops them right after the effects barrier. Module-level (not a
# closure over a decoder) so that the compiled step — cached by jit for the process's life —
# holds no reference to any decoder or its KV caches, and one compilation serves every decoder.
_GATE_MAILBOX: list[tuple[np.ndarray, ...]] = []


def _deliver_gate(*gate) -> None:
    _GATE_MAILBOX.append(gate)


_DELIVER = Static(_deliver_gate)


@functools.partial(jax.jit, static_argnames=("graphdef", "cfg"), donate_argnames=("cache",))
def attention_router_step(graphdef: Static, state, spec, x, cache: KVCache, pos, *,
                          cfg: Static):
    cfg = cfg.value
    layer = nnx.merge(graphdef.value, state)
    with jax.named_scope("attention"):
        h, h_norm, cache = layer.attend(x, cache, pos)
    with jax.named_scope("router"):
        flat = h_norm.reshape(-1, cfg.hidden_size)
        logits = layer.router(flat)
        ids, weights = route(logits, cfg.router, cfg.top_k, cfg.norm_topk_prob,
                             cfg.router_jitter_eps)
        probs = jax.nn.softmax(logits, axis=-1)
        flat_h = h.reshape(-1, cfg.hidden_size)
        spec_in = jax.vmap(lambda s, b: norm(flat_h, cfg.norm, cfg.norm_eps, s, b))(
            spec["scale"], spec["bias"])
        spec_logits = jnp.einsum("lnh,lhe->lne", spec_in, spec["kernel"],
                                 preferred_element_type=jnp.float32)
        spec = jax.nn.softmax(spec_logits, axis=-1)
    return h, h_norm, cache, (ids, weights, probs, spec)


@functools.partial(jax.jit, static_argnames=("graphdef", "cfg", "deliver"),
                   donate_argnames=("cache",))
def attention_router_step_hooked(graphdef: Static, state, spec, x, cache: KVCache, pos, *,
                                 cfg: Static, deliver: Static):
    """`attention_router_step` that hands the gate outputs to the host runtime from inside
    the compiled step (SpecMD's gate hook) through an ordered `io_callback`, instead of the
    host reading them back from the step's outputs."""
    h, h_norm, cache, gate = attention_router_step(graphdef, state, spec, x, cache,
                                                               pos, cfg=cfg)
    io_callback(deliver.value, None, *gate, ordered=True)
    return h, h_norm, cache, gate


@functools.partial(jax.jit, static_argnames=("graphdef", "cfg", "impl", "shared"))
def experts_step(graphdef: Static, state, residual, h_norm, ids, weights, gate_up, down,
                 slot_of, *, cfg: Static, impl: str, shared: bool = True):
    """`residual` plus the routed experts' contributions and the shared expert (`shared`), for
    a layer served in one wave; several waves go through `experts_wave_step` and
    `experts_last_wave_step`, which end in the same operations."""
    cfg = cfg.value
    layer = nnx.merge(graphdef.value, state)
    with jax.named_scope("moe/experts"):
        flat = h_norm.reshape(-1, cfg.hidden_size)
        y = moe_ffn(flat, ids, weights, gate_up, down, slot_of, cfg.hidden_act, impl)
        if shared:
            y = y + layer.shared_expert(flat)
    return residual + y.reshape(residual.shape)


@functools.partial(jax.jit, static_argnames=("cfg", "impl"), donate_argnames=("partial",))
def experts_wave_step(h_norm, ids, weights, gate_up, down, slot_of, partial, *, cfg: Static,
                      impl: str):
    """A wave before its layer's last: the per-contribution outputs `[N, K, H]` (float32) of
    its experts, added to those of the layer's earlier waves (`partial`, None for the first).
    Each contribution is computed in exactly one wave and is 0.0 in the others, so the adds
    are exact."""
    cfg = cfg.value
    with jax.named_scope("moe/experts"):
        flat = h_norm.reshape(-1, cfg.hidden_size)
        out = expert_outputs(flat, ids, weights, gate_up, down, slot_of, cfg.hidden_act, impl)
    return out if partial is None else partial + out


@functools.partial(jax.jit, static_argnames=("graphdef", "cfg", "impl"))
def experts_last_wave_step(graphdef: Static, state, residual, h_norm, ids, weights, gate_up,
                           down, slot_of, partial, *, cfg: Static, impl: str):
    """The last wave of a layer served in several: its contributions join the earlier waves'
    (`partial`), summed over k once and added to the residual with the shared expert — the
    operations `experts_step` does for a layer in one wave, on the same values."""
    cfg = cfg.value
    layer = nnx.merge(graphdef.value, state)
    with jax.named_scope("moe/experts"):
        flat = h_norm.reshape(-1, cfg.hidden_size)
        out = partial + expert_outputs(flat, ids, weights, gate_up, down, slot_of,
                                       cfg.hidden_act, impl)
        y = combine(out, flat.dtype) + layer.shared_expert(flat)
    return residual + y.reshape(residual.shape)


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("cache",))
def dense_layer_step(graphdef: Static, state, x, cache: KVCache, pos):
    layer = nnx.merge(graphdef.value, state)
    with jax.named_scope("attention"):
        h, h_norm, cache = layer.attend(x, cache, pos)
    with jax.named_scope("mlp"):
        return h + layer.mlp(h_norm), cache


@functools.partial(jax.jit, static_argnames=("graphdef",))
def embed_step(graphdef: Static, state, tokens):
    return nnx.merge(graphdef.value, state).embed(tokens)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def logits_step(graphdef: Static, state, x):
    return nnx.merge(graphdef.value, state).logits(x)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def logits_next_step(graphdef: Static, state, x):
    """`logits_step` and the greedy next token of each row (the last position's argmax), in
    one computation: dispatched with the pass, the device picks the token while the host
    ends the pass (an expert cache's checks and decisions), instead of waiting for three
    more dispatches after them."""
    logits = nnx.merge(graphdef.value, state).logits(x)
    return logits, jnp.argmax(logits[:, -1], axis=-1)


def sees_reruns(observer: Callable[[GateOutputs], None]) -> bool:
    """Whether a gate observer is marked `sees_reruns`: of a pass that re-runs layers (a
    speculative pass whose check failed, `moejax.serving.runtime`) it keeps each layer's last
    gate, the pass's own (`moejax.jobs.clocks.RunRouting`). An unmarked one (a trace recorder
    appending every gate it sees) makes the decoder's source decide layer by layer."""
    return bool(getattr(observer, "sees_reruns", False))


class _Head(nnx.Module):
    """Embedding, final norm and LM head, split from the layers so their steps see only these."""

    def __init__(self, model: MoEDecoder):
        self.cfg = model.cfg
        self.embed = model.embed
        self.final_norm = model.final_norm
        if not model.cfg.tie_word_embeddings:
            self.lm_head = model.lm_head

    logits = MoEDecoder.logits


@dataclasses.dataclass
class Generation:
    """Greedy generation output and its timings (host wall clock)."""

    prompt_ids: list[list[int]]
    generated_ids: list[list[int]]
    prefill_s: float
    decode_s: float
    prefill_logits: np.ndarray | None = None  # [B, T, V] when requested
    step_logits: list[np.ndarray] = dataclasses.field(default_factory=list)  # per decode step
    # Each decode pass's wall time, from the end of the one before (the prefill, for the
    # first) to its token on the host; they add up to `decode_s` but for the end's `sync`.
    decode_pass_s: list[float] = dataclasses.field(default_factory=list)


class SteppedDecoder:
    """Runs a `MoEDecoder` layer by layer, asking an `ExpertSource` for each MoE layer's experts.

    `gate_observers` are called with every layer's `GateOutputs` and `pass_observers` with
    the tokens of every finished pass (trace recording, metrics).
    """

    def __init__(self, model: MoEDecoder, experts: ExpertSource, *, max_len: int,
                 batch: int = 1, lookahead: int = 1, gmm_impl: str = "tiled",
                 gate_observers: tuple[Callable[[GateOutputs], None], ...] = (),
                 pass_observers: tuple[Callable[[np.ndarray], None], ...] = (),
                 gate_path: str = "returned"):
        cfg = model.cfg
        if lookahead < 0:
            raise ValueError(f"lookahead must be >= 0, got {lookahead}")
        self.cfg, self.experts, self.max_len, self.batch = cfg, experts, max_len, batch
        self.lookahead, self.gmm_impl = lookahead, gmm_impl
        if gate_path not in GATE_PATHS:
            raise ValueError(f"gate_path={gate_path!r} is not one of {GATE_PATHS}")
        self.gate_path = gate_path
        self.gate_observers = list(gate_observers)
        self.pass_observers = list(pass_observers)
        # Host-side profiler annotations around each step's dispatch (set when tracing; the
        # compiled steps also carry named scopes `attention`, `router`, `moe/experts`).
        self.annotate = lambda name: contextlib.nullcontext()
        self.static_cfg = Static(cfg)
        head_graph, self.head_state = nnx.split(_Head(model))
        self.head_graph = Static(head_graph)
        self.layer_graph, self.layer_state = [], []
        for layer in model.layers:
            g, s = nnx.split(layer)
            self.layer_graph.append(Static(g))
            self.layer_state.append(s)
        self.spec = {l: self._spec_params(model, l) for l in cfg.moe_layers}
        self.pos = 0
        self._on_device = jax.sharding.SingleDeviceSharding(jax.devices()[0],
                                                            memory_kind="device")
        self.caches = self._fresh_caches()

    def _spec_params(self, model: MoEDecoder, layer: int):
        """Stacked post-attention norms and gates of the next `lookahead` MoE layers (rows past
        the last MoE layer are zero padding, so every layer's step has the same shapes)."""
        cfg = self.cfg
        later = [l for l in cfg.moe_layers if l > layer][: self.lookahead]
        rows = max(1, self.lookahead)
        h, e = cfg.hidden_size, cfg.num_experts
        dtype = model.embed.embedding[...].dtype
        scale, bias = np.zeros((rows, h), dtype), np.zeros((rows, h), dtype)
        kernel = np.zeros((rows, h, e), dtype)
        for i, l in enumerate(later):
            blk = model.layers[l]
            scale[i] = np.asarray(blk.post_norm.scale[...])
            bias[i] = np.asarray(blk.post_norm.bias_or_zeros())
            kernel[i] = np.asarray(blk.router.proj.kernel[...])
        arrays = {"scale": scale, "bias": bias, "kernel": kernel}
        return {k: jnp.asarray(v) for k, v in arrays.items()}, tuple(later)

    def reset(self) -> None:
        self.pos = 0
        self.caches = self._fresh_caches()

    def _fresh_caches(self) -> list[KVCache]:
        """Zeroed KV caches, committed to the device as the attention step's outputs are: a
        step's compilation is keyed on its arguments' commitment too, and a pass re-run after a
        failed speculation (`CachedExperts`) hands the attention step caches it already wrote,
        which must not be a shape the warm-up never compiled."""
        return [jax.device_put(KVCache.zeros(self.cfg, self.batch, self.max_len),
                               self._on_device) for _ in range(self.cfg.num_layers)]

    def forward(self, tokens: np.ndarray | jax.Array) -> jax.Array:
        """Runs `tokens` `[B, T]` at the current position; returns float32 logits `[B, T, V]`."""
        return self._forward(tokens, logits_step)

    def forward_next(self, tokens: np.ndarray | jax.Array) -> tuple[jax.Array, jax.Array]:
        """`forward`, and the greedy next token `[B]` computed with the logits
        (`logits_next_step`)."""
        return self._forward(tokens, logits_next_step)

    def _forward(self, tokens, head: Callable):
        """The pass (`forward`), `head` computing its outputs from the last hidden state."""
        # Committed to the device like every step's output, so each step sees one commitment
        # of its arguments whatever the layer (a compilation is keyed on it).
        tokens = jax.device_put(jnp.asarray(tokens, jnp.int32), self._on_device)
        b, t = tokens.shape
        if b != self.batch:
            raise ValueError(f"batch of {b} rows, decoder built for {self.batch}")
        if self.pos + t > self.max_len:
            raise ValueError(f"position {self.pos}+{t} tokens exceeds max_len={self.max_len}")
        pos = jnp.int32(self.pos)
        if hasattr(self.experts, "speculation_allowed"):
            # A speculative pass may compute a layer's gate twice (the later one is the
            # pass's): only observers that keep each layer's last gate of a pass may watch it.
            self.experts.speculation_allowed = all(map(sees_reruns, self.gate_observers))
        self.experts.begin_pass(t, self.pos)
        x = embed_step(self.head_graph, self.head_state, tokens)
        saved: dict[int, tuple] = {}
        out, resume = self._run_from(x, pos, 0, saved, head)
        while resume is not None:
            # A speculative pass's check failed at MoE layer `resume`: the layers before it
            # stand; from its experts step on the pass runs again (attention rewrites the same
            # KV positions).
            out, resume = self._run_from(None, pos, resume, saved, head)
        self.pos += t
        if self.pass_observers:
            host_tokens = np.asarray(tokens)
            for observe in self.pass_observers:
                observe(host_tokens)
        return out

    def _run_from(self, x, pos, start: int, saved: dict[int, tuple], head: Callable):
        """Layers `start`.. (`_layers`), the `head` step's outputs and the source's
        `end_pass`: the outputs and None, or the MoE layer to run again from (`end_pass`'s
        answer, or a `Rewind` the source raised before the pass was through)."""
        try:
            x = self._layers(x, pos, start, saved)
        except Rewind as rewind:
            return None, rewind.layer
        out = head(self.head_graph, self.head_state, x)  # dispatched before the source's end
        return out, self.experts.end_pass()

    def _layers(self, x, pos, start: int, saved: dict[int, tuple]):
        """Runs layers `start`.. on `x`, returning the last hidden state. Each MoE layer's
        attention output, normed input and gate go to `saved`; a run from a MoE layer `start`
        (x None) takes that layer's from there and runs its experts step only."""
        for l in range(start, self.cfg.num_layers):
            g, s = self.layer_graph[l], self.layer_state[l]
            if not self.cfg.is_moe_layer(l):
                with self.annotate("dense_layer"):
                    x, self.caches[l] = dense_layer_step(g, s, x, self.caches[l], pos)
                continue
            if l == start and x is None:
                h, h_norm, gate = saved[l]
            else:
                h, h_norm, gate = self._attention_router(l, x, pos)
                saved[l] = (h, h_norm, gate)
                for observe in self.gate_observers:
                    observe(gate)
            x = self._experts(l, h, h_norm, gate)
        return x

    def _attention_router(self, l: int, x, pos):
        g, s = self.layer_graph[l], self.layer_state[l]
        spec, spec_layers = self.spec[l]
        with self.annotate("attention/router"):
            if self.gate_path == "io_callback":
                h, h_norm, self.caches[l], (ids, w, _, _) = attention_router_step_hooked(
                    g, s, spec, x, self.caches[l], pos, cfg=self.static_cfg,
                    deliver=_DELIVER)
                jax.effects_barrier()  # the callback has run: the gate is on the host
                h_ids, h_w, probs, sp = (np.asarray(a) for a in _GATE_MAILBOX.pop())
                gate = GateOutputs(l, ids, w, probs, sp, spec_layers, h_ids, h_w)
            else:
                h, h_norm, self.caches[l], (ids, w, probs, sp) = attention_router_step(
                    g, s, spec, x, self.caches[l], pos, cfg=self.static_cfg)
                gate = GateOutputs(l, ids, w, probs, sp, spec_layers)
        return h, h_norm, gate

    def _experts(self, l: int, h, h_norm, gate: GateOutputs):
        """The layer's routed experts added to `h`, in the waves its source yields."""
        g, s = self.layer_graph[l], self.layer_state[l]
        x, partial = h, None
        for wave in self.experts.experts_for(gate):
            args = (h_norm, wave.ids, wave.weights, wave.gate_up, wave.down, wave.slot_of)
            with self.annotate("moe/experts"):
                if wave.last and partial is None:  # the layer in one wave
                    x = experts_step(g, s, x, *args, cfg=self.static_cfg, impl=self.gmm_impl)
                elif wave.last:
                    x = experts_last_wave_step(g, s, x, *args, partial, cfg=self.static_cfg,
                                               impl=self.gmm_impl)
                else:  # dispatched now: the source may reload these slots for the next
                    partial = experts_wave_step(*args, partial, cfg=self.static_cfg,
                                                impl=self.gmm_impl)
        return x

    def generate(self, prompt: np.ndarray, max_new_tokens: int, *, eos_id: int | None = None,
                 keep_logits: bool = False,
                 on_token: Callable[[int], None] | None = None,
                 stop: Callable[[list[int]], bool] | None = None) -> Generation:
        """Greedy decoding of `prompt` `[B, T]`. A row is done when it generates `eos_id` or
        when `stop` (called with the row's generated ids after each new token) returns True;
        decoding stops early only when every row is done."""
        prompt = np.asarray(prompt, np.int32)
        self.reset()
        start = time.perf_counter()
        logits, nxt = self.forward_next(prompt)
        nxt = np.asarray(nxt)
        prefill_s = time.perf_counter() - start
        out = Generation(prompt.tolist(), [[] for _ in range(self.batch)], prefill_s, 0.0,
                         np.asarray(logits) if keep_logits else None)
        done = np.zeros(self.batch, bool)
        start = mark = time.perf_counter()
        for step in range(max_new_tokens):
            for row, tok in enumerate(nxt.tolist()):
                if not done[row]:
                    out.generated_ids[row].append(int(tok))
            if eos_id is not None:
                done |= nxt == eos_id
            if stop is not None:
                for row in range(self.batch):
                    if not done[row] and stop(out.generated_ids[row]):
                        done[row] = True
            if on_token is not None:
                on_token(step)
            if done.all() or step == max_new_tokens - 1:
                break
            logits, nxt = self.forward_next(nxt[:, None])
            if keep_logits:
                out.step_logits.append(np.asarray(logits[:, -1]))
            nxt = np.asarray(nxt)
            now = time.perf_counter()
            out.decode_pass_s.append(now - mark)
            mark = now
        # A source may take a pass's decisions while the next pass runs (the expert cache,
        # complete: `CachedExperts.end_pass`): the last ones are taken here, inside the
        # generation's wall time (`decode_s`, which so also holds the prefill pass's).
        sync = getattr(self.experts, "sync", None)
        if sync is not None:
            sync()
        out.decode_s = time.perf_counter() - start
        return out
