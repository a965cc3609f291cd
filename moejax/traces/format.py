"""The moejax routing trace: gate outputs of every pass and MoE layer, in one `.npz` file that
numpy alone reads (no JAX needed).

A *pass* is one forward call: the prefill (all prompt tokens) or one decode step. Token rows of
all passes are concatenated; `pass_offsets[p]:pass_offsets[p+1]` are pass p's rows.

Arrays (R = total token rows, L = MoE layers, K = top-k, E = experts, A = lookahead):

| key | shape / dtype | meaning |
| --- | --- | --- |
| `meta` | 0-d str | JSON: `format`, `model` (ModelConfig dict or id-only shape), `layers` (MoE layer indices), `num_experts`, `top_k`, `expert_bytes`, `lookahead`, `prefill_passes` (leading passes that are prefill, 1 for a live run, 0 for decode-only imports), `source`, free-form `info` |
| `pass_offsets` | [P+1] int64 | row ranges of the passes |
| `tokens` | [R] int32 | the input token of each row (-1 when unknown) |
| `ids` | [R, L, K] int16 | chosen experts in router-rank order |
| `weights` | [R, L, K] float32 | their contribution weights (optional) |
| `probs` | [R, L, E] float16 | router softmax probabilities (optional) |
| `spec_probs` | [R, L, A, E] float16 | gates of the next A MoE layers on this layer's hidden state (optional) |

`spec_probs[:, i, a]` predicts MoE layer `layers[i + a + 1]`; rows past the last layer are 0.
Traces imported from id-only sources carry no `weights`, `probs` or `spec_probs`. (In memory,
`Trace.spec` holds the `spec_probs` array: `spec` is the name the seam uses everywhere.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile
import zlib

import numpy as np

FORMAT = "moejax-trace-v1"


class TraceError(ValueError):
    """A trace file is malformed; the message names the file and what is wrong."""


@dataclasses.dataclass
class Trace:
    meta: dict
    pass_offsets: np.ndarray
    tokens: np.ndarray
    ids: np.ndarray
    weights: np.ndarray | None = None
    probs: np.ndarray | None = None
    spec: np.ndarray | None = None  # stored as the array `spec_probs`

    @property
    def num_passes(self) -> int:
        return len(self.pass_offsets) - 1

    @property
    def layers(self) -> list[int]:
        return list(self.meta["layers"])

    @property
    def num_experts(self) -> int:
        return int(self.meta["num_experts"])

    @property
    def top_k(self) -> int:
        return int(self.meta["top_k"])

    @property
    def has_scores(self) -> bool:
        return self.probs is not None

    @property
    def model_name(self) -> str:
        """The model the trace was recorded from, by its own metadata (never its folder):
        "embedded" (the model moejax ships), "family/preset" of a random-weight preset, the
        checkpoint's directory name (a capture's `meta.model`), else the family or "unknown"."""
        model = self.meta.get("model") if isinstance(self.meta.get("model"), dict) else {}
        source = str(self.meta.get("source") or "").replace("\\", "/").rstrip("/")
        if source.startswith("preset:"):
            return source[len("preset:"):]
        if source.endswith("assets/small_moe"):
            return "embedded"
        name = str(model.get("name") or "").replace("\\", "/").rstrip("/")
        return os.path.basename(name) or str(model.get("family") or "unknown")

    @property
    def synthetic(self) -> bool:
        """Recorded from a random-weight preset: architecture only, no learned routing."""
        return str(self.meta.get("source") or "").startswith("preset:")

    def pass_rows(self, p: int) -> slice:
        return slice(int(self.pass_offsets[p]), int(self.pass_offsets[p + 1]))

    @property
    def prefill_passes(self) -> int:
        return int(self.meta.get("prefill_passes", 0))

    def decode_rows(self) -> np.ndarray:
        """Row index of each decode step (the passes after the prefill ones), in order."""
        return self.pass_offsets[self.prefill_passes:-1].astype(np.int64)

    def decode_ids(self) -> np.ndarray:
        """`[steps, L, K]` ids of the decode steps, in order."""
        return self.ids[self.decode_rows()]

    def first_passes(self, passes: int, **meta) -> Trace:
        """The trace cut to its first `passes` passes (what a run of `passes` passes follows),
        its `meta` updated with `meta` (`prefill_passes` at most `passes`, unless given)."""
        if not 1 <= passes <= self.num_passes:
            raise ValueError(f"first_passes({passes}) of a trace of {self.num_passes} passes")
        rows = int(self.pass_offsets[passes])

        def cut(a):
            return None if a is None else a[:rows]

        meta = {**self.meta, "prefill_passes": min(self.prefill_passes, passes), **meta}
        return Trace(meta, self.pass_offsets[:passes + 1].copy(), self.tokens[:rows],
                     self.ids[:rows], cut(self.weights), cut(self.probs), cut(self.spec))

    def save(self, path: str) -> None:
        arrays = {"meta": np.asarray(json.dumps(self.meta)), "pass_offsets": self.pass_offsets,
                  "tokens": self.tokens, "ids": self.ids}
        for key, value in (("weights", self.weights), ("probs", self.probs),
                           ("spec_probs", self.spec)):
            if value is not None:
                arrays[key] = value
        tmp = f"{path}.tmp.npz"
        try:
            np.savez_compressed(tmp, **arrays)
            os.replace(tmp, path)
        except BaseException:  # an interrupted or failed save leaves no partial file behind
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def validate(self, path: str = "<trace>") -> None:
        def need(cond, msg):
            if not cond:
                raise TraceError(f"{path}: {msg}")

        need(isinstance(self.meta, dict), "meta is not a JSON object")
        missing = [k for k in ("layers", "num_experts", "top_k") if k not in self.meta]
        need(not missing, f"meta lacks {missing}")
        layers = self.meta["layers"]
        need(isinstance(layers, list) and all(_is_int(x) for x in layers),
             f"meta layers={layers!r} is not a list of integers")
        for key in ("num_experts", "top_k"):
            need(_is_int(self.meta[key]) and self.meta[key] >= 1,
                 f"meta {key}={self.meta[key]!r} is not a positive integer")
        need(_is_int(self.meta.get("prefill_passes", 0)),
             f"meta prefill_passes={self.meta.get('prefill_passes')!r} is not an integer")
        need(self.ids.ndim == 3, f"ids must be [rows, layers, top_k], got shape {self.ids.shape}")
        need(np.issubdtype(self.ids.dtype, np.integer), f"ids have dtype {self.ids.dtype}")
        r, l, k = self.ids.shape
        need(r > 0, "no rows")
        e = self.num_experts
        need(len(self.pass_offsets) >= 2, "pass_offsets needs at least two entries")
        need(0 <= self.prefill_passes <= self.num_passes, "prefill_passes out of range")

        need(len(self.layers) == l, f"meta lists {len(self.layers)} layers, ids have {l}")
        need(k == self.top_k, f"ids have {k} experts per token, meta top_k={self.top_k}")
        need(self.pass_offsets[0] == 0 and self.pass_offsets[-1] == r
             and np.all(np.diff(self.pass_offsets) > 0), "pass_offsets do not tile the rows")
        need(self.tokens.shape == (r,), f"tokens shape {self.tokens.shape} != ({r},)")
        need(self.ids.min() >= 0 and self.ids.max() < e, f"expert ids outside 0..{e - 1}")
        if self.weights is not None:
            need(self.weights.shape == (r, l, k), "weights shape does not match ids")
        if self.probs is not None:
            need(self.probs.shape == (r, l, e), "probs shape does not match [rows, layers, E]")
        if self.spec is not None:
            need(self.spec.shape[:2] == (r, l) and self.spec.shape[3] == e,
                 "spec_probs shape does not match [rows, layers, lookahead, E]")


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _read_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of the .npz at `path`, read whole (so a corrupt member fails here)."""
    if os.path.isdir(path):
        raise TraceError(f"{path}: is a directory, not a moejax trace (.npz)")
    try:
        if os.path.getsize(path) == 0:
            raise TraceError(f"{path}: empty (0 bytes), not a moejax trace (.npz)")
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise TraceError(f"{path}: a single .npy array, not a moejax trace (.npz)")
        with z:
            data = {k: z[k] for k in z.files}
    except TraceError:
        raise
    except (zipfile.BadZipFile, EOFError, zlib.error, NotImplementedError) as e:
        # A zip's index sits at its end: a file cut short has none ("not a zip file") or
        # members that end early; anything else (a bad checksum) is corruption.
        cut = isinstance(e, EOFError) or str(e).startswith(("File is not a zip", "Truncated"))
        what = "not a complete .npz trace (cut short?)" if cut else "a corrupt .npz trace"
        raise TraceError(f"{path}: {what}: {e}") from e
    except OSError as e:
        raise TraceError(f"{path}: not readable: {e.strerror or e}") from e
    except ValueError as e:  # an array numpy cannot read (a pickled object array, a bad header)
        raise TraceError(f"{path}: not a readable moejax trace (.npz): {e}") from e
    for key, value in data.items():
        if not isinstance(value, np.ndarray):  # np.load hands a non-.npy member back as bytes
            raise TraceError(f"{path}: member {key!r} is not a numpy array")
    return data


def load(path: str) -> Trace:
    """The trace at `path`, validated; every way the file can be wrong is a TraceError naming
    it (missing, a directory, empty, cut short, corrupt, arrays missing or malformed)."""
    data = _read_npz(path)
    missing = [k for k in ("meta", "pass_offsets", "tokens", "ids") if k not in data]
    if missing:
        raise TraceError(f"{path}: missing arrays {missing}")
    try:
        meta = json.loads(str(data["meta"]))
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: meta is not JSON ({e.msg})") from e
    if not isinstance(meta, dict):
        raise TraceError(f"{path}: meta is not a JSON object")
    if meta.get("format") != FORMAT:
        raise TraceError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    for key in ("ids", "pass_offsets", "tokens"):
        if not np.issubdtype(data[key].dtype, np.integer):
            raise TraceError(f"{path}: {key} have dtype {data[key].dtype}, expected integers")
    trace = Trace(meta, data["pass_offsets"].astype(np.int64), data["tokens"],
                  data["ids"].astype(np.int64), data.get("weights"), data.get("probs"),
                  data.get("spec_probs"))
    trace.validate(path)
    return trace
