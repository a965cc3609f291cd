"""Parsed traces kept in the process, by the content of their file: a sweep's worker runs many
cells on the same few traces, and parsing a capture's JSONL (tens of thousands of rows through
`json` and the importer's checks) costs more than replaying it.

`import_traces_memo(path, num_experts=None, strict=False)` is `importers.import_traces`: the
same traces and notes, the same errors, the same warnings on the importer's logger. The first
call for a file parses it; a later call whose file has the same bytes (SHA-256 of its content,
read again on every call), at the same path as given and with the same options, returns a
deep copy of what that parse returned (a caller may change its copy: the kept one stays as
parsed) and says the parse's warnings again. A file whose content changed is parsed again;
one that changed while it was parsed is returned as parsed and not kept. An import that fails
is not kept (it fails again, the same way). The parse is a function of the bytes, the path as
given (traces and messages name it) and the options, so a kept result is what a fresh parse
would return.

At most `MAX_ENTRIES` files and `MAX_BYTES` of arrays are kept (least recently used first out;
the newest is always kept). `clear()` empties it; `stats()` counts parses and reuses.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import hashlib
import logging
import time

from moejax.traces import importers
from moejax.traces.importers import ImportedTraces

MAX_ENTRIES = 8
MAX_BYTES = 1 << 30
_CHUNK = 1 << 20


@dataclasses.dataclass
class _Entry:
    imported: ImportedTraces
    records: list[logging.LogRecord]  # the parse's warnings, said again on each reuse
    warned: bool  # whether the importer's logger was enabled for warnings during the parse
    nbytes: int


_MEMO: collections.OrderedDict[tuple, _Entry] = collections.OrderedDict()
_STATS = {"parsed": 0, "reused": 0}


def digest(path: str) -> str:
    """SHA-256 of the file's content (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def import_traces_memo(path: str, *, num_experts: int | None = None,
                       strict: bool = False) -> ImportedTraces:
    """`import_traces(path, num_experts=..., strict=...)`, reusing an earlier parse of the same
    bytes (module docstring)."""
    try:
        before = digest(path)
    except OSError:  # the importer names the file its own way
        return importers.import_traces(path, num_experts=num_experts, strict=strict)
    key = (path, before, num_experts, strict)
    log = importers.log
    entry = _MEMO.get(key)
    if entry is not None and (entry.warned or not log.isEnabledFor(logging.WARNING)):
        _MEMO.move_to_end(key)
        _STATS["reused"] += 1
        for record in entry.records:
            again = logging.makeLogRecord(record.__dict__)
            again.created = time.time()
            again.msecs = (again.created - int(again.created)) * 1000
            if log.isEnabledFor(again.levelno):
                log.handle(again)
        return copy.deepcopy(entry.imported)
    recorder = _Recorder()
    log.addHandler(recorder)
    try:
        imported = importers.import_traces(path, num_experts=num_experts, strict=strict)
    finally:
        log.removeHandler(recorder)
    _STATS["parsed"] += 1
    try:
        after = digest(path)
    except OSError:
        after = None
    if after == before:
        _keep(key, _Entry(copy.deepcopy(imported), recorder.records,
                          log.isEnabledFor(logging.WARNING), _nbytes(imported)))
    return imported


class _Recorder(logging.Handler):
    def __init__(self):
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        record = logging.makeLogRecord(record.__dict__)
        record.msg, record.args = record.getMessage(), None  # its text fixed now
        self.records.append(record)


def _nbytes(imported: ImportedTraces) -> int:
    total = 0
    for t in imported.traces:
        for a in (t.pass_offsets, t.tokens, t.ids, t.weights, t.probs, t.spec):
            total += 0 if a is None else a.nbytes
    return total


def _keep(key: tuple, entry: _Entry) -> None:
    _MEMO.pop(key, None)
    _MEMO[key] = entry
    while len(_MEMO) > 1 and (len(_MEMO) > MAX_ENTRIES
                              or sum(e.nbytes for e in _MEMO.values()) > MAX_BYTES):
        _MEMO.popitem(last=False)


def clear() -> None:
    """Forgets every kept parse (and the counts)."""
    _MEMO.clear()
    _STATS.update(parsed=0, reused=0)


def stats() -> dict:
    """{"parsed": files parsed, "reused": calls answered from a kept parse, "kept": entries}."""
    return {**_STATS, "kept": len(_MEMO)}
