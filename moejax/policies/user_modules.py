"""Policies from outside the package: the files and modules `policies.modules` names, and the
installed packages that register through the `moejax.policies` entry point group.

`--config.policies.modules=my_policies.py,lab.policies` imports each (a path to a `.py` file,
or an importable module name) before any policy spec is resolved: `jobs.check` does it, so a
run, a sweep's launch check, each sweep worker and each Slurm task load the same modules, and
a policy in a user's file runs everywhere a built-in one does. What a module registers goes
through `registry.register` with the same checks as a built-in policy; a name that is taken
already is refused. results.json keeps what was loaded (`policy_modules`: each module's path,
the SHA-256 of its file and the policies it registered), so a result says which code made it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys

from moejax.errors import ConfigError
from moejax.policies import registry

ENTRY_POINT_GROUP = "moejax.policies"
# A file's module is imported under this package-less prefix and a digest of its path, so two
# files with the same name do not collide and a file loaded again replaces its own module.
_FILE_MODULE_PREFIX = "moejax_user_policies_"


@dataclasses.dataclass(frozen=True)
class Loaded:
    """One module imported for its policies."""

    given: str  # as named: a path, a module name, or an entry point's `name = module`
    path: str  # the module's file
    sha256: str  # of that file's bytes
    registers: tuple[str, ...]  # "kind name" of each policy it registered

    def record(self) -> dict:
        return {"module": self.given, "path": self.path, "sha256": self.sha256,
                "registers": list(self.registers)}


_loaded: dict[str, Loaded] = {}  # by file path: what this process imported
_by_given: dict[str, Loaded] = {}  # by the name `policies.modules` gave: what it loaded last
_entry_points_done = False


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _import(given: str, importer) -> Loaded:
    before = registry.registered()  # (a copy)
    try:
        module = importer()
    except ConfigError:
        raise
    except Exception as e:  # the user's code: any error it raises is theirs to read
        raise ConfigError(f"policies.modules: importing {given!r} failed: "
                          f"{type(e).__name__}: {e}") from e
    after = registry.registered()
    registers = tuple(f"{kind} {name}" for kind, classes in after.items()
                      for name, cls in classes.items() if before[kind].get(name) is not cls)
    path = os.path.abspath(getattr(module, "__file__", None) or given)
    return Loaded(given, path, _digest(path) if os.path.isfile(path) else "", registers)


def _from_file(given: str) -> Loaded:
    path = os.path.abspath(given)
    if not os.path.isfile(path):
        raise ConfigError(f"policies.modules: {given!r} is not a file (it takes paths to .py "
                          f"files or importable module names, comma-separated)")
    known = _loaded.get(path)
    if known is not None and known.sha256 == _digest(path):
        return known
    # The file of a module imported already under its own name (moejax's own policies, a
    # package's): importing it again would register its policies a second time.
    imported = next((n for n, m in list(sys.modules.items())
                     if not n.startswith(_FILE_MODULE_PREFIX)
                     and getattr(m, "__file__", None)
                     and os.path.abspath(m.__file__) == path), None)
    if imported is not None:
        return dataclasses.replace(_from_module(imported), given=given)
    name = _FILE_MODULE_PREFIX + hashlib.sha256(path.encode()).hexdigest()[:16]

    def importer():
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module

    loaded = _import(given, importer)
    _loaded[path] = loaded
    return loaded


def _from_module(given: str) -> Loaded:
    if given in sys.modules:  # imported already (by the user's own code, or moejax's)
        module = sys.modules[given]
        path = os.path.abspath(getattr(module, "__file__", None) or given)
        if path in _loaded:
            return _loaded[path]
        registers = tuple(f"{kind} {name}" for kind, classes in registry.registered().items()
                          for name, cls in classes.items() if cls.__module__ == given)
        return Loaded(given, path, _digest(path) if os.path.isfile(path) else "", registers)
    try:
        found = importlib.util.find_spec(given)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ConfigError(f"policies.modules: {given!r} is neither a .py file nor an "
                          f"importable module")
    loaded = _import(given, lambda: importlib.import_module(given))
    _loaded[loaded.path] = loaded
    return loaded


def load(modules: str) -> list[Loaded]:
    """Imports each module `modules` names (comma-separated; "" names none) and the entry
    points' (`load_entry_points`); returns what was loaded for this run, in order."""
    load_entry_points()
    out = []
    for given in (m.strip() for m in str(modules or "").split(",")):
        if not given:
            continue
        is_file = given.endswith(".py") or os.sep in given or (os.altsep or os.sep) in given
        out.append(_from_file(given) if is_file else _from_module(given))
        _by_given[given] = out[-1]
    return out


def loaded(modules: str) -> list[Loaded]:
    """What `load(modules)` loaded in this process, without importing anything again: the code
    a run checked its specs against and ran, even if a file changed since."""
    return [_by_given[g] for g in (m.strip() for m in str(modules or "").split(","))
            if g in _by_given]


def load_entry_points() -> list[Loaded]:
    """Imports the modules installed packages declare in the `moejax.policies` entry point
    group (each entry's value is the module that registers its policies), once per process."""
    global _entry_points_done
    if _entry_points_done:
        return [v for v in _loaded.values() if v.given.startswith("entry point ")]
    _entry_points_done = True
    out = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        given = f"entry point {ep.name} = {ep.value}"
        loaded = _import(given, lambda: (ep.load(), importlib.import_module(ep.module))[1])
        _loaded[loaded.path] = loaded
        out.append(loaded)
    return out


def unload() -> None:
    """Takes every policy the loaded files and modules registered out of the registry and
    forgets them (the entry points' too), so that a long-lived process, a notebook's or a test
    module's, can load a changed file as new or leave the built-in set as it was."""
    global _entry_points_done
    for item in _loaded.values():
        for kind_name in item.registers:
            registry.unregister(*kind_name.split(" ", 1))
        module = next((name for name, m in list(sys.modules.items())
                       if getattr(m, "__file__", None) == item.path), None)
        if module is not None:
            del sys.modules[module]
    _loaded.clear()
    _by_given.clear()
    _entry_points_done = False


def records(loaded: list[Loaded]) -> list[dict]:
    """results.json's `policy_modules`: the run's modules, then every entry point's."""
    seen, out = set(), []
    for item in [*loaded, *load_entry_points()]:
        if item.path not in seen:
            seen.add(item.path)
            out.append(item.record())
    return out
