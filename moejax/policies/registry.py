"""Policies chosen by spec strings: `"least_stale"`, `"score_percentile(p=80)"`,
`"topk(overfetch=1.5, lookahead=2)"`, `"cache_aware(0.3)"`.

Each policy kind has its own registry; `build(kind, spec)` parses the spec and calls the
registered constructor, so an unknown name or argument is an error that lists the valid ones.
"""

from __future__ import annotations

import ast
import inspect
from typing import Any, Callable

from moejax.config import ConfigError

_REGISTRIES: dict[str, dict[str, Callable[..., Any]]] = {}


def register(kind: str, name: str):
    def wrap(ctor):
        _REGISTRIES.setdefault(kind, {})[name] = ctor
        return ctor

    return wrap


def names(kind: str) -> list[str]:
    return sorted(_REGISTRIES.get(kind, {}))


def parse(spec: str) -> tuple[str, list[Any], dict[str, Any]]:
    """`"name(1, a=2.5)"` -> `("name", [1], {"a": 2.5})`; arguments are Python literals."""
    try:
        node = ast.parse(spec.strip(), mode="eval").body
    except SyntaxError as e:
        raise ConfigError(f"cannot parse policy spec {spec!r}: {e.msg}") from e
    if isinstance(node, ast.Name):
        return node.id, [], {}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        keys = [k.arg for k in node.keywords]
        if None in keys or len(set(keys)) != len(keys):
            raise ConfigError(f"policy spec {spec!r}: an argument is given twice (or **)")
        try:
            args = [ast.literal_eval(a) for a in node.args]
            kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        except ValueError as e:
            raise ConfigError(f"policy spec {spec!r}: arguments must be literals") from e
        return node.func.id, args, kwargs
    raise ConfigError(f"policy spec {spec!r} must look like name or name(arg=value, ...)")


def build(kind: str, spec: str, **context: Any) -> Any:
    """Builds the `kind` policy named by `spec`. `context` (model shape, seed, ...) is passed to
    constructors that declare those parameters."""
    registry = _REGISTRIES.get(kind, {})
    name, args, kwargs = parse(spec)
    if name not in registry:
        raise ConfigError(f"unknown {kind} policy {name!r} in {spec!r}; valid: {names(kind)}")
    ctor = registry[name]
    params = inspect.signature(ctor).parameters
    user = [p for p in params.values() if p.name not in context and p.kind in
            (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    valid = [p.name for p in user]
    if len(args) > len(valid):
        raise ConfigError(f"{kind} policy {spec!r}: too many arguments; it takes {valid}")
    bound = dict(zip(valid, args))
    for key, value in kwargs.items():
        if key not in valid:
            raise ConfigError(f"{kind} policy {spec!r}: unknown argument {key!r}; it takes {valid}")
        if key in bound:
            raise ConfigError(f"{kind} policy {spec!r}: {key!r} given twice")
        bound[key] = value
    ctx = {k: v for k, v in context.items() if k in params}
    try:
        return ctor(**bound, **ctx)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{kind} policy {spec!r}: {e}") from e
