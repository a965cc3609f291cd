"""Two sweeps, cell by cell: is every results.json the same?

    python -m launch.diff SWEEP_A SWEEP_B [--ignore=replay.seconds,replay.requests_per_s,...]

For checking that a change to moejax (a refactor, another engine, a new machine) leaves every
number a sweep reports unchanged. Each finished cell of A is compared, field by field, with the
cell of B that has the same overrides (read from each sweep's sweep.json, paths relative to the
root it ran from; by directory name when there is no sweep.json; a sweep written before fields
moved into their job's section, `trace` now `replay.trace`, by the current names, overrides and
results.json's `config` alike). What may differ between two identical runs is left out: the wall
clock of the replay (`replay.seconds`, `replay.requests_per_s`, `replay.setup_s`, by default)
and how its kernel was loaded (`replay.setup`: compiled, read from numba's disk cache, or
already in the process — which depends on the cache's state and on which cell a worker ran
first), and, in paths, the
checkout each sweep ran from (`--root_a` / `--root_b`, the repository roots, are replaced by
`<root>` before comparing). Prints the cells that differ with their first differing fields;
exits 1 if any cell differs or is missing from one side, 2 for a path that is not a sweep or a
results.json that does not parse (named).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from moejax import cli
from moejax.analysis.sweep_cells import CORRUPT_HINT, check_sweep_dir
from moejax.cli import UsageError, guarded
from moejax.jobs.schema import MOVED, current_config

PROG = "python -m launch.diff"
DEFAULT_IGNORE = ("replay.seconds", "replay.requests_per_s", "replay.setup_s", "replay.setup")


def _load_json(path: str):
    """A JSON file of a sweep; one that does not parse is an error naming it."""
    try:
        with open(path) as f:
            return json.load(f)
    except ValueError as e:
        raise UsageError(f"{path}: {CORRUPT_HINT} ({type(e).__name__}: {e})") from None


def _cells(sweep_dir: str, root: str) -> dict[str, dict]:
    """Each finished cell's results, keyed by its overrides (paths under `root` made relative)
    when the sweep has a sweep.json, else by its directory name."""
    cells_dir = os.path.join(sweep_dir, "cells")
    if not os.path.isdir(cells_dir):
        raise UsageError(f"{sweep_dir}: not a sweep directory (it has no cells/ folder)")
    keys = {}
    manifest = os.path.join(sweep_dir, "sweep.json")
    if os.path.isfile(manifest):
        listed = _load_json(manifest)
        try:
            for cell in listed["cells"]:
                keys[cell["name"]] = json.dumps(_normalise(_current(cell["overrides"]), root),
                                                sort_keys=True)
        except (KeyError, TypeError):
            raise UsageError(f"{manifest}: not a sweep.json of launch.sweep (each of its "
                             f"\"cells\" has a \"name\" and \"overrides\")") from None
    out = {}
    for name in sorted(os.listdir(cells_dir)):
        path = os.path.join(cells_dir, name, "results.json")
        if os.path.isfile(path):
            results = _load_json(path)
            if isinstance(results, dict) and isinstance(results.get("config"), dict):
                results["config"] = current_config(results["config"])
            out[keys.get(name, name)] = results
    return out


def _current(overrides: dict) -> dict:
    """A cell's overrides by the fields' current names: a sweep written before fields moved
    into their job's section (`schema.MOVED`: `trace` is `replay.trace`) pairs with its cell
    of a sweep written since."""
    if not isinstance(overrides, dict):
        return overrides
    return {MOVED[k] if k in MOVED and " " not in MOVED[k] else k: v
            for k, v in overrides.items()}


def _normalise(value, root: str):
    if isinstance(value, dict):
        return {k: _normalise(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalise(v, root) for v in value]
    if isinstance(value, str) and root:
        return value.replace(root, "<root>")
    return value


def _drop(results: dict, ignore: tuple[str, ...]) -> dict:
    results = json.loads(json.dumps(results))  # a copy
    for dotted in ignore:
        *parents, leaf = dotted.split(".")
        node = results
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return results


def differences(a, b, where: str = "") -> list[str]:
    """The dotted paths at which `a` and `b` differ (floats compared exactly)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            here = f"{where}.{key}" if where else str(key)
            if key not in a or key not in b:
                out.append(f"{here} (only in {'B' if key not in a else 'A'})")
            else:
                out += differences(a[key], b[key], here)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [where or "<top>"]


def compare(sweep_a: str, sweep_b: str, ignore=DEFAULT_IGNORE, root_a: str = "",
            root_b: str = "") -> tuple[int, dict[str, list[str]], list[str]]:
    """(cells compared, {cell: differing fields}, cells finished on one side only)."""
    a, b = _cells(sweep_a, root_a), _cells(sweep_b, root_b)
    one_sided = sorted(set(a) ^ set(b))
    differ = {}
    for name in sorted(set(a) & set(b)):
        x = _normalise(_drop(a[name], tuple(ignore)), root_a)
        y = _normalise(_drop(b[name], tuple(ignore)), root_b)
        d = differences(x, y)
        if d:
            differ[name] = d
    return len(set(a) & set(b)), differ, one_sided


def main(argv=None) -> int:
    p = cli.ArgumentParser(prog=PROG,
                                description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_a")
    p.add_argument("sweep_b")
    p.add_argument("--ignore", default=",".join(DEFAULT_IGNORE),
                   help="comma-separated dotted fields left out of the comparison")
    p.add_argument("--root_a", default="", help="repository root A ran from (paths)")
    p.add_argument("--root_b", default="", help="repository root B ran from (paths)")
    args = p.parse_args(argv)
    return guarded(PROG, lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    check_sweep_dir(args.sweep_a, "SWEEP_A")
    check_sweep_dir(args.sweep_b, "SWEEP_B")
    ignore = tuple(x for x in args.ignore.split(",") if x)
    n, differ, one_sided = compare(args.sweep_a, args.sweep_b, ignore, args.root_a, args.root_b)
    print(f"{n} cells in both; {len(differ)} differ; {len(one_sided)} finished on one side only"
          f" (ignoring {', '.join(ignore) or 'nothing'})")
    for name, fields in list(differ.items())[:20]:
        print(f"  {name}: {', '.join(fields[:5])}{' ...' if len(fields) > 5 else ''}")
    for name in one_sided[:20]:
        print(f"  only on one side: {name}")
    return 1 if differ or one_sided else 0


if __name__ == "__main__":
    sys.exit(main())
