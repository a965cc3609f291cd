"""Result files, written atomically so a killed run never leaves a half-written one."""

from __future__ import annotations

import os
import stat
import tempfile
from typing import Any

from moejax import json_text


def write_json_atomic(path: str, obj: Any) -> None:
    """`obj` as `json.dumps(obj, indent=2)` writes it (numpy values as Python's), atomically
    (`write_text_atomic`); the text by `json_text.dumps`, the same and faster."""
    write_text_atomic(path, json_text.dumps(obj, default=_default))


def write_text_atomic(path: str, text: str) -> None:
    """`path` holds `text`, or what it held before: written to a temporary file beside it,
    synced, then renamed over it. The file gets the mode a plain `open(path, "w")` would give
    it (mkstemp's is 0600): an existing file's own, else 0666 less the umask."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    mode = _mode_for(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _mode_for(path: str) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (setting it to read
    it back races with threads creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
