"""`json.dumps(obj, indent=2, default=default)`'s text, made faster: results.json is written by
every run, and a capture grid writes 768 of them. With `indent`, the standard library encodes
in pure Python, a generator per container yielding a piece per item (about 1.2 ms for a
replay's 38 KB results.json); here a container whose items are all plain scalars (a per-layer
counter row, most of the file) is joined in one list comprehension, the rest walked as the
standard library walks it.

The same text, character for character, for every input `json.dumps` accepts, and the same
exceptions for the others (a circular reference, a key of another type, what `default`
raises): `tests/test_json_text.py` holds the two equal on random trees. What it reproduces
(`json.encoder._make_iterencode` with `indent=2`, `separators=(",", ": ")`, `allow_nan=True`,
`ensure_ascii=True`, `sort_keys=False`): strings by the C `encode_basestring_ascii`, ints and
floats by `int.__repr__` and `float.__repr__` (`NaN`, `Infinity`, `-Infinity`), a subclass
of int or float as its base, tuples as lists, dict keys converted as `json` converts them,
anything else through `default` (checked for circularity first).
"""

from __future__ import annotations

import math
from json.encoder import encode_basestring_ascii as _string
from typing import Any, Callable

INDENT = "  "


def _float(value: float) -> str:
    if value != value:
        return "NaN"
    if value == math.inf:
        return "Infinity"
    if value == -math.inf:
        return "-Infinity"
    return float.__repr__(value)


# A plain scalar's text by its exact type (a subclass takes the walk, as `json` sees it).
_SCALAR: dict[type, Callable[[Any], str]] = {
    str: _string, int: int.__repr__, float: _float, bool: lambda v: "true" if v else "false",
    type(None): lambda v: "null"}


def dumps(obj: Any, default: Callable[[Any], Any]) -> str:
    """`json.dumps(obj, indent=2, default=default)`."""
    out: list[str] = []
    _encode(obj, "\n", out, default, {})
    return "".join(out)


def _encode(o: Any, newline: str, out: list[str], default, markers: dict) -> None:
    if isinstance(o, str):
        out.append(_string(o))
    elif o is None:
        out.append("null")
    elif o is True:
        out.append("true")
    elif o is False:
        out.append("false")
    elif isinstance(o, int):
        out.append(int.__repr__(o))
    elif isinstance(o, float):
        out.append(_float(o))
    elif isinstance(o, (list, tuple)):
        _list(o, newline, out, default, markers)
    elif isinstance(o, dict):
        _dict(o, newline, out, default, markers)
    else:
        _enter(o, markers)
        _encode(default(o), newline, out, default, markers)
        del markers[id(o)]


def _enter(o: Any, markers: dict) -> None:
    if id(o) in markers:
        raise ValueError("Circular reference detected")
    markers[id(o)] = o


def _list(items, newline: str, out: list[str], default, markers: dict) -> None:
    if not items:
        out.append("[]")
        return
    _enter(items, markers)
    inner = newline + INDENT
    try:
        texts = [_SCALAR[type(v)](v) for v in items]
    except KeyError:  # a container or another type among them: item by item
        texts = None
    if texts is not None:
        out.append("[" + inner + ("," + inner).join(texts) + newline + "]")
    else:
        out.append("[" + inner)
        for i, value in enumerate(items):
            if i:
                out.append("," + inner)
            _encode(value, inner, out, default, markers)
        out.append(newline + "]")
    del markers[id(items)]


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, float):
        return _float(key)
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int):
        return int.__repr__(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {key.__class__.__name__}")


def _dict(d: dict, newline: str, out: list[str], default, markers: dict) -> None:
    if not d:
        out.append("{}")
        return
    _enter(d, markers)
    inner = newline + INDENT
    out.append("{" + inner)
    first = True
    for key, value in d.items():
        if not first:
            out.append("," + inner)
        first = False
        out.append(_string(_key(key)) + ": ")
        kind = _SCALAR.get(type(value))
        if kind is not None:
            out.append(kind(value))
        else:
            _encode(value, inner, out, default, markers)
    out.append(newline + "}")
    del markers[id(d)]
