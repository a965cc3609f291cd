"""The live cells a calibration fits the host's work to, and the cells a validation checks the
virtual clock on: fitted and checked on different data (DESIGN.md "The host's work in the
virtual clock").

A cell runs in a *group*: a model and its routing. Trace-driven groups run a family preset
narrowed to `width` (`model.width`) on a real capture's routing (`policies.routing=
'trace(path=T)'`, its first `prefill_tokens` rows one prefill); the embedded group runs the
embedded model on its own routing after a prompt. Calibration uses the prose captures
(`olmoe_prose`, `qwen_prose`) and the embedded model after the default prompt — a capture of
each family, three model depths (16, 24 and 8 MoE layers), so that a pass's own cost and a
layer's are told apart; validation the other captures (OLMoE's and Qwen1.5-MoE's code
captures) and the embedded model after another prompt.
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections

from moejax import bundled
from moejax.calibration.cells import Cell, Entry

# The embedded model's prompts: the calibration's (the default config's), and the validation's.
CALIBRATION_PROMPT = "The Python interpreter"
VALIDATION_PROMPT = "def main():\n    return"
SCORED_PREFETCH = "score_percentile(p=80)"  # SpecMD's default, where the routing has scores


@dataclasses.dataclass(frozen=True)
class Group:
    """A model and its routing: a capture (`trace`: a bundled name, or the path of a capture
    of OLMoE-1B-7B's routing) driving its family's preset at the plan's width, or the embedded
    model after `prompt`."""

    name: str
    trace: str = ""
    prompt: str = ""
    # Config fields every cell of the group sets, as (dotted field, value): what the model is
    # loaded for (a disk tier reads its experts from storage).
    settings: tuple[tuple[str, object], ...] = ()

    @property
    def prefetcher(self) -> str:
        """The group's prefetch policy besides none: `temporal` on a capture (ids only),
        SpecMD's score percentile on the embedded model's own scored routing."""
        return "temporal" if self.trace else SCORED_PREFETCH

    def family(self) -> tuple[str, str] | None:
        """(family, preset) of a capture's model (a capture given as a path is OLMoE's),
        None for the embedded model."""
        if not self.trace:
            return None
        if self.trace not in bundled.CAPTURE_NAMES:
            return bundled.CAPTURE_MODELS["olmoe"]
        return bundled.CAPTURE_MODELS[self.trace.split("_")[0]]

    @property
    def path(self) -> str:
        """The capture's file."""
        return (bundled.capture_path(self.trace) if self.trace in bundled.CAPTURE_NAMES
                else self.trace)


def base_config(group: Group, hardware_file: str, tokens: int, prefill_tokens: int, width: int,
                h2d_gbps: float | None = None) -> ml_collections.ConfigDict:
    """The config every cell of `group` starts from: its model and requests, the profile in
    `hardware_file` (`h2d_gbps` over it), no progress bars or TensorBoard."""
    from moejax.jobs.schema import base_config as schema_base

    c = schema_base()
    c.log.progress = c.log.tensorboard = False
    c.hardware.file = os.path.abspath(hardware_file)
    if h2d_gbps is not None:
        c.hardware.h2d_gbps = float(h2d_gbps)
    c.run.max_new_tokens = tokens
    model = group.family()
    if model is not None:
        c.model.family, c.model.preset, c.model.width = model[0], model[1], width
        c.policies.routing = f"trace(path={group.path!r})"
        c.replay.prefill_tokens = prefill_tokens
    else:
        c.run.prompt = group.prompt
    for field, value in group.settings:
        section, name = field.split(".")
        c[section][name] = value
    return c


def loader(width: int):
    """A function giving each group's model, each shape built once: a capture's family preset
    at `width` with experts drawn (`cells.drawn_model`), or the embedded model."""
    from moejax.calibration.cells import drawn_model
    from moejax.jobs.specs import resolve
    from moejax.model_source import load_model_for

    built: dict = {}

    def model_of(group: Group, base: ml_collections.ConfigDict):
        key = group.family() or ("embedded", group.settings)
        if key not in built:
            built[key] = (drawn_model(key[0], key[1], width) if group.trace
                          else load_model_for(resolve(base)))
        return built[key]
    return model_of


def entries(cells_by_group: list[tuple[Group, list[Cell]]], hardware_file: str, tokens: int,
            prefill_tokens: int, width: int, h2d_gbps: float | None = None,
            workdir: str | None = None) -> list[Entry]:
    """Every (group, cell) as an `Entry` on its group's base config and model. A group with
    a disk tier reads the embedded model in the packed layout (what `io.mode=direct` reads),
    copied once into `workdir`."""
    model_of = loader(width)
    out = []
    for group, cells in cells_by_group:
        base = base_config(group, hardware_file, tokens, prefill_tokens, width, h2d_gbps)
        if dict(group.settings).get("cache.host_capacity_frac", 1.0) < 1:
            base.model.checkpoint = packed_copy(workdir)
        loaded = model_of(group, base)
        out += [Entry(cell, cell.config(base), loaded, group.name) for cell in cells]
    return out


def packed_copy(workdir: str | None) -> str:
    """The embedded model in the packed layout under `workdir` (written the first time)."""
    from moejax.checkpoint import copy_in_layout

    if workdir is None:
        raise ValueError("a disk-tier group needs a workdir for its packed checkpoint")
    path = os.path.join(workdir, "embedded_packed")
    if not os.path.isfile(os.path.join(path, "config.json")):
        copy_in_layout(bundled.EMBEDDED_DIR, path, "packed")
    return path


# This machine's disk as `benchmarks/cold_read.py` measured it (O_DIRECT, bytes never read
# since boot; studies/dossier/grid_disk.py's THIS_DISK): the disk tier's storage profile.
THIS_DISK = (("storage.read_gbps", 0.72), ("storage.read_latency_s", 1.65e-4),
             ("storage.queue_depth", 8))


def _set(**fields) -> tuple[tuple[str, object], ...]:
    return tuple((k.replace("__", "."), v) for k, v in fields.items())


def calibration_cells(group: Group, capacities=(0.05, 0.25, 1.0),
                      quantized: bool = True) -> list[Cell]:
    """What a fit needs to tell the terms apart, on one group: each capacity with and without
    prefetch (layers with and without loads, prefetch loads), a warm full cache speculating
    and not (layers with no load, speculative passes that hold; without a trace, complete
    passes decided after them), and a quantized cache (another step table)."""
    out = [Cell(c, p) for c in capacities for p in ("none", group.prefetcher)]
    out += [Cell(1.0, "none", True, "all"), Cell(1.0, "none", False, "all")]
    if group.trace and quantized:
        out.append(Cell(min(capacities[-1], 0.25), "none",
                        settings=_set(cache__precision="int4")))
    return out


CALIBRATION_GROUPS = (Group("olmoe_prose", trace="olmoe_prose"),
                      Group("qwen_prose", trace="qwen_prose"),
                      Group("embedded", prompt=CALIBRATION_PROMPT))


def validation_matrix(quick: bool = False) -> list[tuple[Group, list[Cell]]]:
    """The validation's cells: on OLMoE's code capture, capacity {5, 25,
    100%} x eviction {lru, lru_per_layer, least_stale} x prefetch {none, temporal} x precision
    {native, int4}; on Qwen1.5-MoE's code capture and on the embedded model (its own scored
    routing: score_percentile), capacity x eviction {lru, least_stale} x prefetch; on the
    embedded model, the disk tier (host 30%, io.mode pread and direct) and host compute
    (host_compute, latency_aware). `quick`: two cells, for the tests."""
    olmoe, qwen = Group("olmoe_code", trace="olmoe_code"), Group("qwen_code", trace="qwen_code")
    embedded = Group("embedded_code", prompt=VALIDATION_PROMPT)
    if quick:
        return [(olmoe, [Cell(0.25, "none", settings=_set(policies__eviction="lru")),
                         Cell(0.25, "temporal", settings=_set(policies__eviction="lru"))])]
    capacities = (0.05, 0.25, 1.0)
    out = [(olmoe, [Cell(c, p, settings=_set(policies__eviction=e, cache__precision=q))
                    for q in ("", "int4") for c in capacities
                    for e in ("lru", "lru_per_layer", "least_stale")
                    for p in ("none", "temporal")])]
    for group in (qwen, embedded):
        out.append((group, [Cell(c, p, settings=_set(policies__eviction=e))
                            for c in capacities for e in ("lru", "least_stale")
                            for p in ("none", group.prefetcher)]))
    out.append((Group("embedded_disk", prompt=VALIDATION_PROMPT,
                      settings=_set(cache__host_capacity_frac=0.3) + THIS_DISK),
                [Cell(0.25, "none", settings=_set(policies__eviction="lru", io__mode=m))
                 for m in ("pread", "direct")]))
    out.append((Group("embedded_host", prompt=VALIDATION_PROMPT),
                [Cell(c, "none", settings=_set(policies__miss=m))
                 for c in (0.05, 0.25) for m in ("host_compute", "latency_aware")]))
    return out


def condition(row: dict) -> str:
    """The condition a row's policies are ranked within: its group, capacity, precision and
    tier (disk tier, host compute)."""
    s = row.get("settings", {})
    tier = ("disk" if "io.mode" in s else
            "host compute" if s.get("policies.miss", "fetch") != "fetch" else "device")
    return (f"{row['group']} {100 * row['capacity_frac']:g}% "
            f"{s.get('cache.precision') or 'native'} {tier}")


def policy(row: dict) -> str:
    """What a row's cell chose within its condition: eviction, prefetch, miss, io."""
    s = row.get("settings", {})
    parts = [s.get("policies.eviction", ""), row["prefetch"], s.get("policies.miss", ""),
             s.get("io.mode", "")]
    return " ".join(p for p in parts if p)
