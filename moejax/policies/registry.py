"""Policies chosen by spec strings: `"least_stale"`, `"score_percentile(p=80)"`,
`"topk(overfetch=1.5, lookahead=2)"`, `"cache_aware(0.3)"`.

Each policy kind has its own registry; `build(kind, spec)` parses the spec and calls the
registered constructor, so an unknown name or argument is an error that lists the valid ones.
A registered class must subclass its kind's base (`policies/base.py`), which declares its
capabilities; `policy_class(kind, spec)` reads them without building the policy. Names that
later tiers will fill (`PLANNED`) are not choices: asking for one says what it waits for.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from collections.abc import Iterable
from typing import Any

from moejax.errors import ConfigError
from moejax.policies.base import KINDS, Policy

_REGISTRIES: dict[str, dict[str, type[Policy]]] = {kind: {} for kind in KINDS}

# Names a later tier will fill, and what each waits for (none at present: the precision
# tiers' `lhu`, `fetch_lowest_bit` and `fetch_priority` are built).
PLANNED: dict[tuple[str, str], str] = {}

# Constructor parameters only the cache's context fills, never a spec's argument (built without
# them, a policy takes its default): the plain precision (`moejax.cache.policy_context`).
CONTEXT_ONLY = frozenset({"cache_precision"})
# Every constructor parameter the cache's context may fill (`moejax.cache.policy_context`);
# the others are the policy's spec arguments, each of which must declare its values (`ARGS`).
CONTEXT = frozenset({"num_layers", "num_experts", "top_k", "num_slots", "seed", "renormalize"}
                    ) | CONTEXT_ONLY


def spec_arguments(cls: type[Policy]) -> dict[str, Any]:
    """The arguments a spec may give `cls`, with their defaults (`inspect.Parameter.empty`
    when required), in the constructor's order."""
    return {p.name: p.default for p in _parameters(cls) if p.name not in CONTEXT
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def register(kind: str, name: str):
    """Class decorator: `cls` becomes policy `name` of `kind`. A class that does not set its own
    `name` gets this one. A name registered already by another module is refused (a module
    imported again, e.g. a user's file loaded anew, replaces its own policies)."""
    if kind not in KINDS:
        raise ValueError(f"unknown policy kind {kind!r}; kinds: {sorted(KINDS)}")

    def wrap(cls):
        if not (isinstance(cls, type) and issubclass(cls, KINDS[kind])):
            raise TypeError(f"{kind} policy {name!r} must subclass {KINDS[kind].__name__}")
        if "name" not in cls.__dict__:
            cls.name = name
        if cls.name != name:
            raise TypeError(f"{cls.__name__}.name is {cls.name!r}, registered as {name!r}")
        taken = _REGISTRIES[kind].get(name)
        if taken is not None and taken.__module__ != cls.__module__:
            raise TypeError(f"{kind} policy {name!r} is registered already, by "
                            f"{taken.__module__}.{taken.__qualname__}: choose another name")
        undeclared = sorted(set(spec_arguments(cls)) ^ set(cls.ARGS))
        if undeclared:
            raise TypeError(f"{kind} policy {name!r}: ARGS must declare exactly its spec "
                            f"arguments {list(spec_arguments(cls))}; mismatch: {undeclared}")
        _REGISTRIES[kind][name] = cls
        return cls

    return wrap


def registered() -> dict[str, dict[str, type[Policy]]]:
    """Every registered class by kind and name (a copy)."""
    return {kind: dict(classes) for kind, classes in _REGISTRIES.items()}


def unregister(kind: str, name: str) -> None:
    """Takes policy `name` of `kind` out of the registry (`user_modules.unload`)."""
    _REGISTRIES[kind].pop(name, None)


def names(kind: str, *, live: bool | None = None) -> list[str]:
    """The registered policies of `kind`; `live=True`: only those that run live,
    `live=False`: only the replay-only ones."""
    classes = _REGISTRIES.get(kind, {})
    return sorted(n for n, c in classes.items() if live is None or c.replay_only != live)


def policy_class(kind: str, spec: str) -> type[Policy]:
    """The class a spec (`"lru"`, `"topk(overfetch=1.5)"`) names, for its declared
    capabilities."""
    name = parse(spec)[0]
    if (kind, name) in PLANNED:
        raise ConfigError(f"{kind} policy {name!r}: {PLANNED[(kind, name)]}")
    registry = _REGISTRIES.get(kind)
    if registry is None:
        raise ConfigError(f"unknown policy kind {kind!r}; kinds: {sorted(_REGISTRIES)}")
    if name not in registry:
        raise ConfigError(f"unknown {kind} policy {name!r}; valid: {names(kind)}")
    return registry[name]


class _BareNamesAsStrings(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.Constant:
        return ast.copy_location(ast.Constant(node.id), node)


def _literal(node: ast.AST) -> Any:
    """A Python literal, where a bare name is its string: the shell strips the quotes of
    `--config.policies.eviction=least_stale(order="left_first")`, so `order=left_first` must
    mean the same."""
    return ast.literal_eval(_BareNamesAsStrings().visit(node))


# Arguments that name a file (`trace(path=T)`): a path is rarely a Python literal
# (`moejax/assets/x.jsonl`, `/tmp/t.npz`) and the shell strips the quotes around one, so when a
# spec does not parse as literals these are read as their text, as `cache.seed` reads its trace.
TEXT_ARGUMENTS = frozenset({"path"})
_CALL = re.compile(r"\s*([A-Za-z_]\w*)\s*\((.*)\)\s*", re.S)
# A `,` that starts the next keyword argument: the only `,` a text argument ends at.
_NEXT_KEYWORD = re.compile(r",\s*(?=[A-Za-z_]\w*\s*=)")


def _with_text_arguments(spec: str) -> tuple[str, list[Any], dict[str, Any]] | None:
    """`spec` read with its `TEXT_ARGUMENTS` as text (quotes optional) and every other argument
    a literal; None when it has no text argument or is not `name(key=value, ...)` then."""
    m = _CALL.fullmatch(spec)
    if m is None or not m[2].strip():
        return None
    kwargs: dict[str, Any] = {}
    for part in _NEXT_KEYWORD.split(m[2].strip()):
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key.isidentifier() or key in kwargs:
            return None
        if key in TEXT_ARGUMENTS:
            quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""
            kwargs[key] = value[1:-1] if quoted else value
            continue
        try:
            kwargs[key] = _literal(ast.parse(value, mode="eval").body)
        except (SyntaxError, ValueError):
            return None
    return (m[1], [], kwargs) if TEXT_ARGUMENTS & set(kwargs) else None


def parse(spec: str) -> tuple[str, list[Any], dict[str, Any]]:
    """`"name(1, a=2.5, b=x)"` -> `("name", [1], {"a": 2.5, "b": "x"})`; arguments are
    Python literals or bare names (strings), and a `TEXT_ARGUMENTS` keyword whatever its text
    (`trace(path=moejax/assets/x.jsonl)`)."""
    try:
        node = ast.parse(spec.strip(), mode="eval").body
    except SyntaxError as e:
        text = _with_text_arguments(spec)
        if text is not None:
            return text
        raise ConfigError(f"cannot parse policy spec {spec!r}: {e.msg}") from e
    if isinstance(node, ast.Name):
        return node.id, [], {}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        keys = [k.arg for k in node.keywords]
        if None in keys or len(set(keys)) != len(keys):
            raise ConfigError(f"policy spec {spec!r}: an argument is given twice (or **)")
        try:
            args = [_literal(a) for a in node.args]
            kwargs = {k.arg: _literal(k.value) for k in node.keywords}
        except ValueError as e:
            text = _with_text_arguments(spec)
            if text is not None:
                return text
            raise ConfigError(f"policy spec {spec!r}: arguments must be literals") from e
        return node.func.id, args, kwargs
    raise ConfigError(f"policy spec {spec!r} must look like name or name(arg=value, ...)")


def check(kind: str, spec: str) -> type[Policy]:
    """What `build` checks of `spec` before it builds the policy, without the cache's context:
    the policy's name, its arguments' names and count, each against the values it declares
    (`ARGS`), and every required one given. Returns the class. What a constructor checks
    against the cache's shape (a lookahead beyond the model's MoE layers) waits for `build`."""
    name, args, kwargs = parse(spec)
    ctor = policy_class(kind, name)
    _bind(kind, spec, ctor, args, kwargs, CONTEXT)
    return ctor


@functools.cache
def _parameters(ctor: type[Policy]) -> tuple[inspect.Parameter, ...]:
    """`ctor`'s parameters, read once per class (`inspect.signature` was most of a policy
    check's time, and a sweep checks and builds each cell's policies)."""
    return tuple(inspect.signature(ctor).parameters.values())


def _bind(kind: str, spec: str, ctor: type[Policy], args: list[Any], kwargs: dict[str, Any],
          context: Iterable[str]) -> dict[str, Any]:
    """The spec's arguments bound to `ctor`'s parameters other than the `context` ones, each
    checked against its declared values."""
    user = [p for p in _parameters(ctor) if p.name not in context and p.name not in CONTEXT_ONLY
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
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
    missing = [p.name for p in user if p.default is p.empty and p.name not in bound]
    if missing:
        raise ConfigError(f"{kind} policy {spec!r}: {', '.join(missing)} must be given; it "
                          f"takes {valid}")
    for key, value in bound.items():
        # Once here for every policy: a constructor comparing a string with a number would
        # say only "'<=' not supported between 'str' and 'int'".
        domain = ctor.ARGS.get(key)
        if domain is not None and domain.refuses(value):
            raise ConfigError(f"{kind} policy {spec!r}: {key}={value!r} must be "
                              f"{domain.takes()}")
    return bound


def build(kind: str, spec: str, **context: Any) -> Any:
    """Builds the `kind` policy named by `spec`. `context` (model shape, seed, ...) is passed to
    constructors that declare those parameters."""
    name, args, kwargs = parse(spec)
    ctor = policy_class(kind, name)
    names = {p.name for p in _parameters(ctor)}
    bound = _bind(kind, spec, ctor, args, kwargs, context)
    ctx = {k: v for k, v in context.items() if k in names}
    try:
        policy = ctor(**bound, **ctx)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{kind} policy {spec!r}: {e}") from e
    policy.arguments = {name: bound.get(name, default)
                        for name, default in spec_arguments(ctor).items()}
    return policy
