"""The quality–speed frontier (SpecMD Fig. 5 / Fig. 7): what each miss policy, routing and
expert precision costs the model's output against what it buys in speed.

python -m launch.sweep --config=studies/specmd/grid_quality.py --sweep_dir=/tmp/grid_q --workers=2
python -m launch.sweep --config=studies/specmd/grid_quality.py:models=embedded,parts=miss+cross \
    --sweep_dir=/tmp/grid_q
python -m moejax.analysis.report --sweep_dir=/tmp/grid_q

Every cell is the `quality` job (moejax/jobs/quality.py): the configured cache against the
same model with every expert resident at native precision (the reference), teacher-forced
one token per forward (`quality.teacher_forcing=decode`) on the first QUALITY_TOKENS tokens
of a held-out text shipped with the package (`text=` prose (default), code, math, unseen:
`moejax/assets/heldout/`), then DRIFT_PROMPTS greedy requests of DRIFT_PROMPT_TOKENS prompt
+ DRIFT_NEW_TOKENS new tokens served by both. Quality: KL(reference || cached), top-1
agreement, bits per byte and its change, greedy drift. Speed: decode tok/s and TTFT of the
drift requests on the cache's virtual clock (`clock.kind=virtual`: the same numbers on any
machine), SpecMD's A100 profile (5 GB/s host->device). Eviction and prefetch are SpecMD's
recommended ones (least_stale, score_percentile(p=80): the defaults). Capacity: 5% and 25% of
the whole model's bytes (`cache.capacity_of=model`, as SpecMD); `cache.min_slots` is the
model's top-k (TOP_K), without which 5% of a tiny model is below one layer's top-k.

Models (`models=` all (default), embedded, families):
* `embedded`: the small OLMoE-family model moejax trained and ships (learned weights; its
  checkpoint holds int8 / int4 / int2 experts too): the meaningful quality numbers;
* `families`: the tiny presets of mixtral, olmoe, phimoe, qwen2_moe with random weights
  (quantized in memory): architecture-dependent effects only (top-k, expert count, router
  normalisation); their KL says how far a policy moves a random model's output, not a
  trained one's. A random model's next-token distribution is nearly flat, so a small KL can
  still flip its argmax: top-1 agreement and drift mean little there. With top-k 2 (mixtral,
  phimoe), `drop(keep=2)` keeps every expert: it is plain fetch there.

Parts (`parts=` all (default) or a '+'-list; cells shared by parts run once):
* `miss` — each miss policy of MISSES x capacities, standard routing, each at its own
  precision: fetch, drop and substitute native; fetch_priority its default cascade
  int8:int4:int2 (>= p60 of the gate scores at int8, p30-p60 int4, below int2: three pools
  sharing the budget), fetch_lowest_bit int8:int4 (misses at int4, prefetches at int8).
  Answers SpecMD: Fetch Priority sits on the frontier (faster than fetch at little KL),
  Drop costs quality for its speed, Substitution fails (quality lost, little speed gained);
* `routing` — plain fetch x each routing of ROUTINGS (standard and cache_aware with
  λ in 0.1, 0.3, 0.5, 1.0) x capacities. Answers: cache-aware routing is best at
  λ 0.1-0.5 (speed from hits, small KL); at λ 1.0 the bias overrides the router;
* `precision` — plain fetch, standard routing, every expert at native / int8 / int4 / int2
  (`cache.precision`) x capacities: what uniform quantization alone trades;
* `cross` — each miss policy x each routing at 5% on the embedded model only (only with
  `models` all or embedded): whether the miss policies and cache-aware routing add up.

Cells per model: `miss` 6 x 2 = 12, `routing` 5 x 2 = 10, `precision` 4 x 2 = 8 — the
plain fetch + standard routing + native cell (the baseline the report compares against) is
in all three, so 12 + 8 + 6 = 26 distinct; `cross` 6 x 5 = 30 on the embedded model, 20 of
them new. Total: 5 x 26 + 20 = 150 cells (`models=embedded`: 46, `models=families`: 104;
`parts=miss`: 60, `parts=routing`: 50, `parts=precision`: 40, `parts=cross`: 30). On a 2-core
CPU a cell takes about 5-20 s in a worker that has run its model before (the first cell of a
model in a worker compiles: 30-45 s); the whole grid took 853 s with `--workers=2` (docs/findings/quality.md).

The report (`python -m moejax.analysis.report`) draws `fig_quality_frontier.png` (one panel
per model and capacity: x decode tok/s, y KL mean, the Pareto frontier as a step line) and
writes a "Quality–speed frontier" section with one table per model and capacity.
"""

from moejax import bundled
from moejax.jobs.schema import base_config, parse_args

CAPACITIES = (0.05, 0.25)
CROSS_CAPACITY = 0.05
MISSES = ("fetch", "fetch_priority", "fetch_lowest_bit", "drop(keep=1)", "drop(keep=2)",
          "substitute(tol=0.05)")
ROUTINGS = ("standard", "cache_aware(lam=0.1)", "cache_aware(lam=0.3)",
            "cache_aware(lam=0.5)", "cache_aware(lam=1.0)")
PRECISIONS = ("native", "int8", "int4", "int2")
PARTS = ("miss", "routing", "precision", "cross")
MODEL_GROUPS = ("all", "embedded", "families")
FAMILIES = bundled.TRACE_FAMILIES  # mixtral, olmoe, phimoe, qwen2_moe
# Each model's top-k, the floor of its cache (checked against the presets by
# tests/test_grid_quality.py; not computed here: the launcher imports this file without JAX).
TOP_K = {"embedded": 4, "mixtral": 2, "olmoe": 4, "phimoe": 2, "qwen2_moe": 4}

QUALITY_TOKENS = 256
SEGMENT_TOKENS = 256
DRIFT_PROMPTS = 3
DRIFT_PROMPT_TOKENS = 32
DRIFT_NEW_TOKENS = 32
_ARGS = {"parts": "all", "models": "all", "text": "prose"}


def get_config(arg: str | None = None):
    args = parse_args(arg, _ARGS)
    c = base_config()
    c.job = "quality"
    c.quality.text_file = bundled.heldout_path(args["text"])
    c.quality.teacher_forcing = "decode"
    c.quality.max_tokens = QUALITY_TOKENS
    c.quality.segment_tokens = SEGMENT_TOKENS
    c.quality.drift_prompts = DRIFT_PROMPTS
    c.quality.drift_prompt_tokens = DRIFT_PROMPT_TOKENS
    c.quality.drift_new_tokens = DRIFT_NEW_TOKENS
    c.clock.kind = "virtual"
    c.cache.capacity_of = "model"  # SpecMD counts capacity against the whole model
    c.hardware.preset = "a100_specmd"  # 5 GB/s host->device
    c.log.progress = False
    c.log.tensorboard = False
    return c


def models(which: str) -> list[tuple[str, dict]]:
    """(name, overrides) of the models of `which` (one of MODEL_GROUPS)."""
    if which not in MODEL_GROUPS:
        raise ValueError(f"models={which!r}: expected one of {MODEL_GROUPS}")
    out = []
    if which in ("all", "embedded"):
        out.append(("embedded", {"model.family": "olmoe", "model.preset": "embedded",
                                 "cache.min_slots": TOP_K["embedded"]}))
    if which in ("all", "families"):
        out += [(f, {"model.family": f, "model.preset": "tiny", "cache.min_slots": TOP_K[f]})
                for f in FAMILIES]
    return out


def _parts(text: str) -> tuple[str, ...]:
    parts = PARTS if text == "all" else tuple(text.split("+"))
    if not parts or not set(parts) <= set(PARTS):
        raise ValueError(f"parts={text!r}: expected all or a '+'-list of {PARTS}")
    return parts


def _cell(model: dict, capacity: float, miss: str = "fetch", routing: str = "standard",
          precision: str = "") -> dict:
    cell = {**model, "cache.capacity_frac": capacity, "policies.miss": miss,
            "policies.routing": routing}
    if precision:  # "" leaves the miss policy's own levels (native for fetch)
        cell["cache.precision"] = precision
    return cell


def cells(arg: str | None = None) -> list[dict]:
    """Every cell's overrides, in sweep order, each once."""
    args = parse_args(arg, _ARGS)
    parts = _parts(args["parts"])
    out: dict[tuple, dict] = {}

    def put(cell: dict) -> None:
        out.setdefault(tuple(sorted(cell.items())), cell)

    for name, model in models(args["models"]):
        for capacity in CAPACITIES:
            if "miss" in parts:
                for miss in MISSES:
                    put(_cell(model, capacity, miss=miss))
            if "routing" in parts:
                for routing in ROUTINGS:
                    put(_cell(model, capacity, routing=routing))
            if "precision" in parts:
                for precision in PRECISIONS:
                    # native is plain fetch's own precision: the same cell as the baseline.
                    put(_cell(model, capacity, precision="" if precision == "native"
                              else precision))
        if "cross" in parts and name == "embedded":
            for miss in MISSES:
                for routing in ROUTINGS:
                    put(_cell(model, CROSS_CAPACITY, miss=miss, routing=routing))
    return list(out.values())


def sweep(add, arg: str | None = None):
    for cell in cells(arg):
        add(**cell)
