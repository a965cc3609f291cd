"""The house in order: no import cycle inside moejax, no private name reached from outside its
module, a face (`__init__.py` with `__all__`) for every package, no two modules of one name,
nothing importing the `moejax.sim` aliases, and README's layout and DESIGN's tree naming every
top-level module and package. Read from the source with `ast`: nothing is imported but what the
faces say."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "moejax")
# Private attributes of other libraries' objects that tests may read (jax's compilation
# count of a jitted function; NamedTuple's own API; a process pool's workers, which
# concurrent.futures offers no other way to kill).
# Private names of other libraries that the code reaches on purpose (`_lru_hit_rate`: boyle's
# LRU, which benchmarks/replay_vs_peer.py times as it is).
FOREIGN_PRIVATE = {"_cache_size", "_asdict", "_replace", "_fields", "_processes", "_exit",
                   "_lru_hit_rate"}


def _modules() -> dict[str, str]:
    """moejax's module names -> their files (packages as their `__init__.py`)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(PACKAGE):
        dirnames[:] = [d for d in dirnames if d not in ("assets", "__pycache__")]
        for f in filenames:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(dirpath, f)
    return out


MODULES = _modules()


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imports(name: str, path: str) -> set[str]:
    """What importing module `name` executes of moejax: every moejax module it imports (at
    module level or inside a function), each with the packages above it that `name` is not
    inside of (their faces run first) — and a package `name` is inside of when it imports
    names from that package's face itself."""
    tree = ast.parse(open(path).read())
    is_package = path.endswith("__init__.py")
    here = name if is_package else name.rsplit(".", 1)[0]
    own = set(_ancestors(name)) | {name}
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here.split(".")[:len(here.split(".")) - node.level + 1]
                                + ([base] if base else []))
            mods = []
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in MODULES:
                    mods.append(sub)
                elif base in MODULES:
                    mods.append(base)
                    if base in own and base != name:  # a name from its own package's face
                        targets.add(base)
        else:
            continue
        for mod in mods:
            if mod not in MODULES and not mod.startswith("moejax"):
                continue
            for m in [*_ancestors(mod), mod]:
                if m in MODULES and m not in own:
                    targets.add(m)
    targets.discard(name)
    return targets


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_inside_moejax():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _python_files():
    for top in ("moejax", "launch", "benchmarks", "tests", "configs", "studies"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d not in ("assets", "__pycache__")]
            for f in filenames:
                if f.endswith(".py"):
                    yield os.path.join(dirpath, f)


def _private_reaches(path: str) -> list[str]:
    """`obj._name` for any `obj` other than self / cls / super(), the same through getattr /
    setattr / hasattr (monkeypatch's included), and `from m import _name`."""
    tree = ast.parse(open(path).read())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and re.match(r"_[^_]", node.attr):
            value = node.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "super":
                continue
            if node.attr in FOREIGN_PRIVATE:
                continue
            out.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
              and (getattr(node.func, "id", None) or getattr(node.func, "attr", None))
              in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and re.match(r"_[^_]", node.args[1].value)
              and node.args[1].value not in FOREIGN_PRIVATE):
            out.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                ("moejax", "launch", "tests")):
            out += [f"{os.path.relpath(path, ROOT)}:{node.lineno}: from {node.module} import "
                    f"{a.name}" for a in node.names if re.match(r"_[^_]", a.name)]
    return out


def test_nothing_reaches_a_private_name_of_another_object():
    found = [hit for path in _python_files() for hit in _private_reaches(path)]
    assert found == []


@pytest.mark.parametrize("package", sorted(n for n, p in MODULES.items()
                                           if p.endswith("__init__.py")))
def test_every_package_has_a_face(package):
    """A docstring saying what the package holds, and `__all__` naming what it offers, each
    name importable from it."""
    path = MODULES[package]
    tree = ast.parse(open(path).read())
    assert ast.get_docstring(tree), f"{path} has no docstring"
    if package == "moejax":
        return
    module = importlib.import_module(package)
    assert module.__all__, f"{package}.__all__ is empty"
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.__all__ names {name}, which it lacks"


def _top_level() -> list[str]:
    """What moejax holds at its top: `x.py` for a module, `p/` for a package or a folder of data
    (`assets/`), as README's layout and DESIGN's tree name them."""
    out = []
    for entry in os.listdir(PACKAGE):
        path = os.path.join(PACKAGE, entry)
        if os.path.isdir(path) and entry != "__pycache__" and not entry.endswith(".egg-info"):
            out.append(f"{entry}/")
        elif entry.endswith(".py") and entry not in ("__init__.py", "__main__.py"):
            out.append(entry)
    return sorted(out)


def _readme_layout() -> str:
    readme = open(os.path.join(ROOT, "README.md")).read()
    layout = readme[readme.index("## Layout"):]
    return layout[:layout.index("\n## ", 1)] if "\n## " in layout[1:] else layout


def test_the_readme_layout_names_every_package():
    layout = _readme_layout()
    packages = sorted({n.split(".")[1] for n in MODULES if n.count(".") == 1
                       and MODULES[n].endswith("__init__.py")})
    missing = [p for p in packages if f"`moejax/{p}/`" not in layout]
    assert missing == [], f"README's layout lacks {missing}"
    for top in ("configs", "launch", "benchmarks", "tests", "docs"):
        assert f"`{top}/`" in layout, top


def test_the_readme_layout_and_design_tree_name_every_top_level_module():
    """Every module and package directly under moejax/ has a row of README's layout table (a
    `what` that is not empty) and a line of DESIGN's tree (`  name  what it holds`)."""
    rows = {}
    for line in _readme_layout().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 2:
            for name in re.findall(r"`moejax/([^`]+)`", cells[0]):
                rows[name] = cells[1]
    design = open(os.path.join(ROOT, "docs", "DESIGN.md")).read()
    start = design.index("```\nmoejax/\n")
    tree = design[start:design.index("```", start + 3)]
    lines = {m.group(1): m.group(2) for m in re.finditer(r"^  (\S+) +(\S.*)$", tree, re.M)}
    entries = _top_level()
    assert "calibration/" in entries and "testing.py" in entries  # the walk finds them
    assert [e for e in entries if not rows.get(e)] == [], "README's layout lacks these"
    assert [e for e in entries if e not in lines] == [], "DESIGN's tree lacks these"
    assert [n for n in rows if "/" not in n.rstrip("/") and n not in entries] == [], \
        "README's layout names what moejax no longer holds"
    assert [n for n in lines if n not in entries] == [], "DESIGN's tree names what is gone"


def test_no_two_modules_share_a_name():
    """A module's file name says what it holds wherever it is read (a traceback, a grep, an
    editor's tab): no two modules in moejax/ have the same one (a package's `__init__.py` and
    `__main__.py` aside)."""
    seen: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        base = os.path.basename(path)
        if base not in ("__init__.py", "__main__.py"):
            seen.setdefault(base, []).append(os.path.relpath(path, ROOT))
    assert {b: p for b, p in seen.items() if len(p) > 1} == {}


ALIASES = {"moejax.sim.calibrate": "moejax.calibration.calibrate",
           "moejax.sim.validate": "moejax.calibration.validate"}


def test_nothing_in_moejax_imports_the_sim_aliases():
    """`moejax.sim` is only the old command names, kept for scripts outside the project: no
    module of moejax (but the aliases themselves) imports it, and it holds nothing else."""
    users = [name for name, path in MODULES.items() if not name.startswith("moejax.sim")
             and any(m == "moejax.sim" or m.startswith("moejax.sim.")
                     for m in _imports(name, path))]
    assert users == []
    assert sorted(n for n in MODULES if n.startswith("moejax.sim")) == sorted(
        ["moejax.sim", *ALIASES, *(f"{a}.__main__" for a in ALIASES)])


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_the_old_commands_run_the_new_ones(alias):
    """`python -m moejax.sim.calibrate` / `.validate` run the calibration's own `main`: the
    same flags, the same output; `--help` answers from the command line without JAX."""
    module = importlib.import_module(alias)
    assert module.main is importlib.import_module(ALIASES[alias]).main
    out = subprocess.run([sys.executable, "-m", alias, "--help"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    new = "python -m moejax.calibration" + ("" if alias.endswith("calibrate") else ".validate")
    assert out.stdout.startswith(f"usage: {new} ") and "--workdir" in out.stdout


def test_python_m_moejax_calibration_is_the_calibration():
    out = subprocess.run([sys.executable, "-m", "moejax.calibration", "--help"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m moejax.calibration ")
    assert "--host-only" in out.stdout


def test_launch_is_packaged():
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert re.search(r'include = \[.*"launch\*".*\]', text)


# -- studies/: a study's code and data stay out of the library ----------------------------------
def test_studies_are_not_packaged():
    """studies/ runs from the repository root (`python -m studies.specmd.claims`), as configs/
    does; the installed package is moejax (and launch) alone."""
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    include = re.search(r"\[tool\.setuptools\.packages\.find\]\ninclude = \[(.*)\]", text)
    assert include and "studies" not in include.group(1)
    assert os.path.isfile(os.path.join(ROOT, "studies", "__init__.py"))


def _imports_of(path: str) -> list[str]:
    """Every module name `path` imports (absolute), and every string `import_module` is given."""
    out = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.append(node.module or "")
        elif (isinstance(node, ast.Call) and node.args
              and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
              in ("import_module", "__import__")
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append(node.args[0].value)
    return out


def test_the_library_imports_no_study():
    """A study imports the library, never the other way: nothing under moejax/ (nor launch/)
    imports `studies`."""
    found = [f"{os.path.relpath(path, ROOT)}: {m}" for top in ("moejax", "launch")
             for path in _python_files() if os.path.relpath(path, ROOT).startswith(top + os.sep)
             for m in _imports_of(path) if m == "studies" or m.startswith("studies.")]
    assert found == []


# A paper's numbers are a study's data (studies/specmd/paper.py, studies/fiddler/claims.py):
# SpecMD's LS collision rate, hit rate, drop-in TTFT and factor bands, Fiddler's speedups.
PAPER_NUMBERS = ("1.6–1.9", "1.6-1.9", "88–92", "88-92", "34.7", "10.7", "2.6–8.6", "58–91",
                 "1.26", "1.30×", "1.30x")


def test_no_module_of_the_library_holds_a_papers_numbers():
    found = [f"{os.path.relpath(path, ROOT)}:{i}: {n}" for path in _python_files()
             if os.path.relpath(path, ROOT).startswith("moejax" + os.sep)
             for i, line in enumerate(open(path, encoding="utf-8"), 1)
             for n in PAPER_NUMBERS if n in line]
    assert found == []
    # The numbers are where the test looks for them (so it can fail).
    paper = open(os.path.join(ROOT, "studies", "specmd", "paper.py"), encoding="utf-8").read()
    assert all(n in paper for n in ("1.6–1.9", "88–92", "34.7"))
    assert "1.26" in open(os.path.join(ROOT, "studies", "fiddler", "claims.py")).read()


# The packages whose face (`__init__.py`, its `__all__`) is the only way in from outside.
FACED = ("cache", "models", "traces", "quant", "timing", "checkpoint")


def _internals_reached(path: str, package: str) -> list[str]:
    """Imports of a module inside `moejax.<package>` (`from moejax.<package>.x import ...`,
    `import moejax.<package>.x`) in `path`."""
    inside, out = f"moejax.{package}.", []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(inside):
            out.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: from {node.module}")
        elif isinstance(node, ast.Import):
            out += [f"{os.path.relpath(path, ROOT)}:{node.lineno}: import {a.name}"
                    for a in node.names if a.name.startswith(inside)]
    return out


@pytest.mark.parametrize("package", FACED)
def test_code_outside_a_package_imports_it_through_its_face(package):
    """The library, the launcher, the studies, the benchmarks and the configs import each of
    these packages as `from moejax.<package> import ...` (its `__all__`); only its own modules
    and the tests of its parts reach inside it."""
    found = [hit for path in _python_files()
             if not os.path.relpath(path, ROOT).startswith(("tests", os.path.join("moejax",
                                                                                   package)))
             for hit in _internals_reached(path, package)]
    assert found == []


@pytest.mark.parametrize("package", FACED)
def test_every_name_a_face_offers_resolves(package):
    """Each name in a face's `__all__` is there (the names that load JAX resolve when asked)."""
    code = (f"import moejax.{package} as p; "
            "print([n for n in p.__all__ if getattr(p, n, None) is None])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_cache_and_replay_load_no_jax_and_no_command_line():
    """The cache engine and both replay engines are numpy (and numba): importing them loads
    neither JAX nor Flax, so a replay on any CPU starts without them; nor the command line's
    formatting (`moejax.cli`): library code raises and warns through `moejax.errors`."""
    code = ("import sys, moejax.cache, moejax.replay, moejax.policies, moejax.timing, "
            "moejax.traces, moejax.quant; "
            "print(sorted({'jax', 'flax', 'qwix', 'moejax.cli'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# What a replay never needs: the model's framework and the checkpoint's storage stack.
MODEL_STACK = {"jax", "flax", "qwix", "tensorstore", "orbax"}


@pytest.mark.parametrize("config", ["replay", "curve"])
def test_a_replay_and_a_curve_run_without_jax(tmp_path, config):
    """A replay (and a capacity curve) reads a trace and runs numpy and numba: the whole
    command — the config's check, a capacity of the whole model's bytes at four bits, the
    virtual clock's cost model, the report — imports none of the model stack, whose import is
    most of a short replay's start (about 2.5 s of a grid worker's). `-X importtime` lists
    every module the process imported."""
    from moejax import bundled

    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "moejax.main",
         f"--config=configs/{config}.py",
         f"--config.replay.trace={bundled.capture_path('olmoe_prose')}",
         "--config.model.family=olmoe", "--config.model.preset=olmoe-1b-7b",
         "--config.cache.capacity_frac=0.05", "--config.cache.capacity_of=model",
         "--config.cache.precision=int4", "--config.log.progress=False",
         f"--workdir={tmp_path / 'w'}"],
        capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0]
                for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "moejax" in imported and "numba" in imported  # (the listing is read)
    assert sorted(MODEL_STACK & imported) == []


def test_design_describes_the_system_not_its_history():
    """DESIGN.md is reference: no issue numbers (the history is CHANGELOG.md's)."""
    design = open(os.path.join(ROOT, "docs", "DESIGN.md")).read()
    assert re.findall(r"\b[Ii]ssues? \d+", design) == []
    assert os.path.isfile(os.path.join(ROOT, "CHANGELOG.md"))
