"""What routing looks like: the figures behind docs/findings/embedded_model.md's routing section.

    python -m moejax.analysis.routing_stats TRACE [TRACE ...]

Per trace, over its decode steps (single-token passes), averaged over MoE layers:

* `entropy_frac`: entropy of the expert-usage distribution / log2(E) (1.0 = uniform use);
* `reuse`: mean |S_t ∩ S_{t-1}| / K, how much of a layer's expert set the next token reuses
  (K/E for independent uniform choices);
* `spec_topk_precision`: the next layer's gate on this layer's hidden state, top-K of it
  against the experts the next layer really chose (precision = recall for equal-size sets);
* `spec_p80_precision` / `spec_p80_recall`: the same with every expert above the 80th
  percentile of the speculative scores (SpecMD's score-based prefetch set).
"""

from __future__ import annotations

import os
import sys

import numpy as np

from moejax.cli import UsageError, guarded
from moejax.traces import Trace, TraceError, load_traces

PROG = "python -m moejax.analysis.routing_stats"


def usage_entropy_frac(ids: np.ndarray, num_experts: int) -> np.ndarray:
    """Per layer: entropy of expert usage over all steps, as a fraction of log2(E)."""
    out = []
    for l in range(ids.shape[1]):
        counts = np.bincount(ids[:, l].reshape(-1), minlength=num_experts).astype(float)
        p = counts / counts.sum()
        nz = p[p > 0]
        out.append(float(-(nz * np.log2(nz)).sum() / np.log2(num_experts)))
    return np.asarray(out)


def reuse_rate(ids: np.ndarray) -> np.ndarray:
    """Per layer: mean fraction of the previous step's experts chosen again."""
    k = ids.shape[2]
    prev, cur = ids[:-1], ids[1:]
    inter = (prev[..., :, None] == cur[..., None, :]).any(-1).sum(-1)  # [S-1, L]
    return inter.mean(0) / k


def spec_scores(trace: Trace, rows: np.ndarray, percentile: float = 80.0):
    """Per predicted layer pair (l -> next MoE layer): top-K precision, p-percentile precision
    and recall of the lookahead-1 speculative scores."""
    spec = trace.spec[rows, :, 0].astype(np.float32)  # [S, L, E]
    ids = trace.ids[rows]
    e, k = trace.num_experts, trace.top_k
    topk, p_prec, p_rec = [], [], []
    for l in range(ids.shape[1] - 1):
        actual = np.zeros((len(rows), e), bool)
        np.put_along_axis(actual, ids[:, l + 1], True, axis=-1)
        pred_k = np.zeros_like(actual)
        np.put_along_axis(pred_k, np.argsort(-spec[:, l], axis=-1)[:, :k], True, axis=-1)
        topk.append((pred_k & actual).sum() / pred_k.sum())
        thresh = np.percentile(spec[:, l], percentile, axis=-1, keepdims=True)
        pred_p = spec[:, l] > thresh
        p_prec.append((pred_p & actual).sum() / max(1, pred_p.sum()))
        p_rec.append((pred_p & actual).sum() / actual.sum())
    return np.asarray(topk), np.asarray(p_prec), np.asarray(p_rec)


def summarize(trace: Trace) -> dict[str, float]:
    rows = trace.decode_rows()
    ids = trace.ids[rows]
    out = {"steps": len(rows), "layers": ids.shape[1], "experts": trace.num_experts,
           "top_k": trace.top_k,
           "entropy_frac": float(usage_entropy_frac(ids, trace.num_experts).mean()),
           "entropy_frac_min": float(usage_entropy_frac(ids, trace.num_experts).min()),
           "reuse": float(reuse_rate(ids).mean()),
           "reuse_uniform": trace.top_k / trace.num_experts}
    if trace.spec is not None:
        topk, p_prec, p_rec = spec_scores(trace, rows)
        out.update(spec_topk_precision=float(topk.mean()), spec_p80_precision=float(p_prec.mean()),
                   spec_p80_recall=float(p_rec.mean()))
    return out


COLUMNS = ("steps", "layers", "experts", "top_k", "entropy_frac", "entropy_frac_min", "reuse",
           "reuse_uniform", "spec_topk_precision", "spec_p80_precision", "spec_p80_recall")


def _traces(path: str) -> list[Trace]:
    """The file's traces; a path that is not a trace file is a usage error naming it."""
    if os.path.isdir(path):
        raise UsageError(f"{path}: is a directory; give trace files (.npz, .jsonl)")
    try:
        return load_traces(path)
    except TraceError as e:
        raise UsageError(str(e)) from None


def table(paths: list[str]) -> str:
    lines = ["| trace | " + " | ".join(COLUMNS) + " |",
             "| --- |" + " ---: |" * len(COLUMNS)]
    for path in paths:
        for i, trace in enumerate(_traces(path)):
            s = summarize(trace)
            name = path.rsplit("/", 1)[-1] + (f"#{i}" if i else "")
            cells = [f"{s[c]:.3f}" if isinstance(s.get(c), float) else str(s.get(c, "–"))
                     for c in COLUMNS]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: {PROG} TRACE [TRACE ...]\n\n{__doc__.split(chr(10) * 2)[0]}",
              file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    return guarded(PROG, lambda: print(table(argv)))


if __name__ == "__main__":
    sys.exit(main())
