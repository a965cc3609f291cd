"""A sweep's cells: the overrides a config file's `sweep(add)` produces, their names, the
command line that runs each one alone, and whether it has finished.

Nothing here imports JAX: the launching process loads config files only to call `sweep`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import pickle
import re
import shlex
import sys
import types
import weakref
from typing import Any, Callable, Iterable

from moejax.cli import bash_quote, config_flag

# Override values the config flag parser and the cell names know how to write.
Value = str | int | float | bool

MAX_NAME = 150
HASH_LEN = 8
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
# Characters a cell name may hold: POSIX portable file name characters plus the separators
# `,` and `=` (neither needs quoting in a shell).
NAME_RE = re.compile(r"[A-Za-z0-9._+,=-]+\Z")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")
# Inside a value, spec punctuation becomes readable file name characters:
# "topk(overfetch=1.5, lookahead=2)" -> "topk_overfetch-1.5_lookahead-2".
_SPEC_CHARS = str.maketrans({"(": "_", ")": "", "=": "-", ",": "_", " ": ""})


class SweepError(ValueError):
    """The sweep itself is malformed (a bad key or value, a duplicate cell)."""


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str
    overrides: dict[str, Value]  # dotted field name -> value, in the order `add` got them


# -- config files ----------------------------------------------------------------------------
def split_config(spec: str) -> tuple[str, str | None]:
    """`"configs/x.py:arg"` -> `("configs/x.py", "arg")`; like ml_collections, everything right
    of the first colon is the argument."""
    path, sep, arg = spec.partition(":")
    return path, (arg if sep else None)


def join_config(path: str, arg: str | None) -> str:
    return path if arg is None else f"{path}:{arg}"


# A config file's source as last read, and its compiled code, by path: a sweep's worker loads
# the same file for every cell it runs (a fresh module each time), and compiles it again only
# when its bytes changed.
_COMPILED: dict[str, tuple[bytes, types.CodeType]] = {}


def load_config_module(path: str) -> types.ModuleType:
    """Imports a config file from its path (a fresh module object each call, run from the
    file's current bytes)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path!r} does not exist")
    name = "_moejax_sweep_config_" + hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None:  # not a .py file: no loader for it
        raise SweepError(f"{path} is not a Python file: a config file is a .py defining "
                         f"get_config()")
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader
    if not isinstance(loader, importlib.machinery.SourceFileLoader):
        loader.exec_module(module)
        return module
    source = loader.get_data(spec.origin)
    held = _COMPILED.get(spec.origin)
    if held is None or held[0] != source:
        held = _COMPILED[spec.origin] = (source, loader.source_to_code(source, spec.origin))
    exec(held[1], module.__dict__)  # what exec_module does, with the code compiled once
    _SOURCE[module] = (spec.origin, source)
    return module


def call_get_config(module: types.ModuleType, arg: str | None):
    """`get_config()` or `get_config(arg)`, as `--config=path[:arg]` calls it."""
    return module.get_config() if arg is None else module.get_config(arg)


# `get_config(arg)`'s result, pickled, by (the config file's path and bytes, arg): a sweep's
# worker builds the same base config for every cell, about 1.1 ms through ml_collections (the
# capture grid: twice a cell, checked then run), and unpickling it takes 0.2 ms. A result is
# given as a copy only once two fresh calls pickled the same bytes: a get_config whose result
# changes from call to call (or that does not pickle) is called for every cell.
_BUILT: dict[tuple, tuple[bytes, bool]] = {}
_SOURCE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> (path, bytes)


def get_config_copy(module: types.ModuleType, arg: str | None):
    """`call_get_config(module, arg)` for a module of `load_config_module`: a fresh call, or a
    copy of an equal earlier result of the same file's bytes (`_BUILT`)."""
    source = _SOURCE.get(module)
    if source is None:
        return call_get_config(module, arg)
    key = (*source, arg)
    blob, same = _BUILT.get(key, (None, False))
    if same:
        return pickle.loads(blob)
    config = call_get_config(module, arg)
    if blob == b"":  # two calls differed, or the result does not pickle: fresh every time
        return config
    try:
        now = pickle.dumps(config)
    except Exception:
        now = b""
    if len(_BUILT) >= 64:
        _BUILT.clear()
    _BUILT[key] = (now, False) if blob is None else (now, True) if now == blob else (b"", False)
    return config


def _accepts_arg(fn: Callable) -> bool:
    """Whether `fn(add, arg)` is a valid call."""
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        return False
    return True


# -- expansion -------------------------------------------------------------------------------
def check_override(key: Any, value: Any) -> None:
    if not isinstance(key, str) or not _KEY.match(key):
        raise SweepError(f"override key {key!r} is not a dotted field name such as "
                         f"'cache.capacity_frac'")
    if not isinstance(value, (str, int, float, bool)):
        raise SweepError(f"override {key}={value!r}: values must be str, int, float or bool "
                         f"(got {type(value).__name__})")
    if isinstance(value, str) and "\0" in value:
        raise SweepError(f"override {key}={value!r}: a NUL character cannot be passed as a flag")


def collect(sweep_fn: Callable | None, arg: str | None = None) -> list[dict[str, Value]]:
    """The overrides of each `add(**overrides)` call of `sweep_fn`, in call order. A config
    without `sweep` is one cell with no overrides."""
    if sweep_fn is None:
        return [{}]
    added: list[dict[str, Value]] = []

    def add(**overrides: Value) -> None:
        for key, value in overrides.items():
            check_override(key, value)
        added.append(dict(overrides))

    if _accepts_arg(sweep_fn):
        sweep_fn(add, arg)
    else:  # a sweep without an argument; `arg` still reaches get_config
        sweep_fn(add)
    if not added:
        raise SweepError("sweep(add) added no cells")
    return added


def cells_from_config(path: str, arg: str | None) -> list[Cell]:
    module = load_config_module(path)
    if not callable(getattr(module, "get_config", None)):
        raise SweepError(f"{path} defines no get_config()")
    return make_cells(collect(getattr(module, "sweep", None), arg))


def make_cells(overrides_list: Iterable[dict[str, Value]]) -> list[Cell]:
    """Names every cell; two `add` calls with the same overrides are an error."""
    overrides_list = [dict(o) for o in overrides_list]
    seen: dict[str, int] = {}
    for i, o in enumerate(overrides_list):
        key = canonical(o)
        if key in seen:
            raise SweepError(f"cells {seen[key]} and {i} have the same overrides: {o}")
        seen[key] = i
    return [Cell(n, o) for n, o in zip(cell_names(overrides_list), overrides_list)]


# -- names -----------------------------------------------------------------------------------
def canonical(overrides: dict[str, Value]) -> str:
    """Order-independent and type-preserving (1, 1.0, "1" and true differ)."""
    return json.dumps(overrides, sort_keys=True, separators=(",", ":"))


def overrides_hash(overrides: dict[str, Value]) -> str:
    return hashlib.sha1(canonical(overrides).encode()).hexdigest()[:HASH_LEN]


def _name_value(value: Value) -> str:
    if isinstance(value, bool):
        s = "true" if value else "false"
    elif isinstance(value, (int, float)):
        s = repr(value)
    else:
        s = value
        if "/" in s.rstrip("/"):  # a path: its last component is what tells cells apart
            s = s.rstrip("/").rsplit("/", 1)[1]
        s = s.translate(_SPEC_CHARS)
    return _UNSAFE.sub("_", s)


def readable_name(overrides: dict[str, Value]) -> str:
    """`capacity_frac=0.05,eviction=lru,prefetch=topk_overfetch-1.5`: keys sorted, each shown by
    its last component unless two keys share it; names longer than MAX_NAME are cut and end in
    a hash of the overrides."""
    if not overrides:
        return "default"
    keys = sorted(overrides)
    last = [k.rsplit(".", 1)[-1] for k in keys]
    parts = [f"{short if last.count(short) == 1 else key}={_name_value(overrides[key])}"
             for key, short in zip(keys, last)]
    name = ",".join(parts)
    if len(name) > MAX_NAME:
        name = f"{name[:MAX_NAME - HASH_LEN - 2]}-h{overrides_hash(overrides)}"
    return name


def cell_names(overrides_list: list[dict[str, Value]]) -> list[str]:
    """Readable names, unique within the sweep: where sanitising or shortening makes two cells'
    names equal (ignoring case, for case-insensitive file systems), each of them gets a hash
    of its full overrides appended."""
    names = [readable_name(o) for o in overrides_list]
    counts: dict[str, int] = {}
    for n in names:
        counts[n.lower()] = counts.get(n.lower(), 0) + 1
    for i, (n, o) in enumerate(zip(names, overrides_list)):
        if counts[n.lower()] > 1:
            tag = f"-h{overrides_hash(o)}"
            names[i] = n[:MAX_NAME - len(tag)] + tag
    if len({n.lower() for n in names}) != len(names):  # needs a sha1-prefix coincidence
        raise SweepError("cell names collide even after hashing; rename a value")
    return names


# -- command lines ---------------------------------------------------------------------------
def command(config: str, arg: str | None, workdir: str, overrides: dict[str, Value],
            python: str = "python") -> str:
    """The shell command that runs one cell alone: `python -m moejax.main --config=...`."""
    argv = [python, "-m", "moejax.main", f"--config={join_config(config, arg)}",
            f"--workdir={workdir}"]
    return " ".join([*(bash_quote(a) for a in argv),
                     *(config_flag(k, v) for k, v in overrides.items())])


# -- state -----------------------------------------------------------------------------------
def cell_dir(sweep_dir: str, name: str) -> str:
    return os.path.join(sweep_dir, "cells", name)


def results_path(sweep_dir: str, name: str) -> str:
    return os.path.join(cell_dir(sweep_dir, name), "results.json")


def is_finished(path: str) -> bool:
    """A results.json that exists and parses. Jobs write it atomically, so a killed run leaves
    none; an unreadable one (written by something else) counts as unfinished and is re-run."""
    try:
        with open(path) as f:
            json.load(f)
    except (OSError, ValueError):
        return False
    return True


def select(cells: list[Cell], only: str | None) -> list[Cell]:
    if not only:
        return cells
    pattern = re.compile(only)
    return [c for c in cells if pattern.search(c.name)]


def launcher_argv() -> str:
    return " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable), "-m",
                                             "launch.sweep", *sys.argv[1:]])
