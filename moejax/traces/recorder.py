"""Records a live run's gate outputs into a `Trace` (a gate observer of `SteppedDecoder`)."""

from __future__ import annotations

import numpy as np

from moejax.model_config import ModelConfig
from moejax.seam import GateOutputs
from moejax.traces.format import FORMAT, Trace


class TraceRecorder:
    """Collects every MoE layer's `GateOutputs` (as a gate observer) and closes a pass when the
    decoder reports its tokens (as a pass observer). Batch row 0 is recorded."""

    def __init__(self, cfg: ModelConfig, lookahead: int, source: str, info: dict | None = None,
                 score_dtype=np.float32):
        # float32 scores keep a replay bit-identical to the live run (DESIGN invariant 4);
        # float16 halves committed test data.
        self.cfg, self.lookahead, self.score_dtype = cfg, lookahead, score_dtype
        self.meta = {"format": FORMAT, "model": cfg.to_dict(), "layers": list(cfg.moe_layers),
                     "num_experts": cfg.num_experts, "top_k": cfg.top_k,
                     "expert_bytes": cfg.expert_bytes, "lookahead": lookahead, "source": source,
                     "prefill_passes": 1, "info": info or {}}
        self._current: dict[int, GateOutputs] = {}
        self._tokens: list[np.ndarray] = []
        self._rows: dict[str, list[np.ndarray]] = {k: [] for k in
                                                    ("ids", "weights", "probs", "spec")}

    def on_gate(self, gate: GateOutputs) -> None:
        self._current[gate.layer] = gate

    def end_pass(self, tokens: np.ndarray) -> None:
        """`tokens` `[B, T]` the pass consumed."""
        row0 = np.asarray(tokens)[0]
        t = len(row0)
        gates = [self._current[l] for l in self.cfg.moe_layers]
        self._tokens.append(row0.astype(np.int32))
        # [T, L, ...]: rows of batch row 0 are the first T of the flattened [B*T] rows.
        self._rows["ids"].append(np.stack([np.asarray(g.ids)[:t] for g in gates], 1))
        self._rows["weights"].append(np.stack([np.asarray(g.weights)[:t] for g in gates], 1))
        self._rows["probs"].append(np.stack([np.asarray(g.probs)[:t] for g in gates], 1))
        spec = []
        for g in gates:
            rows = np.array(np.asarray(g.spec)[:, :t])
            rows[len(g.spec_layers):] = 0.0  # padding rows past the last MoE layer
            spec.append(np.moveaxis(rows, 0, 1))
        self._rows["spec"].append(np.stack(spec, 1))
        self._current = {}

    def trace(self) -> Trace:
        offsets = np.cumsum([0] + [len(t) for t in self._tokens]).astype(np.int64)
        cat = {k: np.concatenate(v) for k, v in self._rows.items()}
        spec = cat["spec"].astype(self.score_dtype) if self.lookahead > 0 else None
        return Trace(self.meta, offsets, np.concatenate(self._tokens),
                     cat["ids"].astype(np.int16), cat["weights"].astype(np.float32),
                     cat["probs"].astype(self.score_dtype), spec)
