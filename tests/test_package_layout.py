"""The house in order: no import cycle inside moejax, no private name reached from outside its
module, a face (`__init__.py` with `__all__`) for every package, and README's layout naming
every package. Read from the source with `ast`: nothing is imported but what the faces say."""

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
FOREIGN_PRIVATE = {"_cache_size", "_asdict", "_replace", "_fields", "_processes", "_exit"}


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
    for top in ("moejax", "launch", "benchmarks", "tests", "configs"):
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


def test_the_readme_layout_names_every_package():
    readme = open(os.path.join(ROOT, "README.md")).read()
    layout = readme[readme.index("## Layout"):]
    layout = layout[:layout.index("\n## ", 1)] if "\n## " in layout[1:] else layout
    packages = sorted({n.split(".")[1] for n in MODULES if n.count(".") == 1
                       and MODULES[n].endswith("__init__.py")})
    missing = [p for p in packages if f"`moejax/{p}/`" not in layout]
    assert missing == [], f"README's layout lacks {missing}"
    for top in ("configs", "launch", "benchmarks", "tests", "docs"):
        assert f"`{top}/`" in layout, top


def test_launch_is_packaged():
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert re.search(r'include = \[.*"launch\*".*\]', text)


def test_the_cache_and_replay_load_no_jax():
    """The cache engine and both replay engines are numpy (and numba): importing them loads
    neither JAX nor Flax, so a replay on any CPU starts without them."""
    code = ("import sys, moejax.cache, moejax.replay, moejax.policies, moejax.timing, "
            "moejax.traces, moejax.quant; "
            "print(sorted({'jax', 'flax', 'qwix'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
