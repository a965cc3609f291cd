"""A run's claim on its workdir: checked before anything is written, held by one run at a time,
and left as the run found it when the run wrote nothing.

`claim(path)` checks that the workdir is (or can be made) a writable directory, creates it if
it is missing, and takes its lock: the file `.moejax.lock` in it, `fcntl.flock`ed for the whole
run and holding the run's pid, host, start time and command line. A second run into the same
workdir is refused with a line naming the run that holds it (two runs would overwrite each
other's results.json and mix their TensorBoard events). The kernel drops a flock when its
process dies however it dies, so a lock file left by a killed run is simply taken over, with a
note naming that run.

On release the lock file is removed, and a directory this run created (the workdir, and any
parent it had to create) is removed again if it is still empty, so a run that failed before
writing anything leaves nothing behind; a directory the run did not create is never removed.
`Claim.kept()` says, in one line, what the run left in the workdir (for Ctrl-C's message).

Every refusal is a `UsageError` naming `--workdir=PATH` (status 2).

`fresh(config)` is the workdir of a run given none: `runs/<config name>-<date-time>/`, a
directory no earlier run used.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from typing import Iterator

from moejax.errors import UsageError

LOCK_NAME = ".moejax.lock"
FLAG = "--workdir"


def _refuse(path: str, why: str, flag: str = FLAG) -> UsageError:
    return UsageError(f"{flag}={path}: {why}")


def _missing_parents(path: str, flag: str = FLAG) -> list[str]:
    """The directories `os.makedirs(path)` would create, deepest first; raises a UsageError
    when an existing part of the path is not a directory."""
    missing: list[str] = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        if os.path.lexists(current):
            if current == os.path.abspath(path):
                raise _refuse(path, "is a file, not a directory", flag)
            raise _refuse(path, f"{current} is a file, not a directory", flag)
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return missing


def check(path: str, flag: str = FLAG) -> None:
    """Raises a UsageError naming `flag`, writing nothing, when `path` is not a directory a run
    can write into: empty, a file, under a file, or in (or under) a directory this process may
    not write."""
    if not path:
        raise UsageError(f"{flag} is empty: name a directory for the run's output")
    missing = _missing_parents(path, flag)
    where = os.path.dirname(missing[-1]) if missing else os.path.abspath(path)
    if not os.access(where, os.W_OK | os.X_OK):
        if missing:
            raise _refuse(path, f"cannot be created: {where} is not writable", flag)
        raise _refuse(path, "is not writable", flag)


def _describe(holder: dict) -> str:
    started = holder.get("started")
    when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
            if isinstance(started, (int, float)) else "an unknown time")
    command = holder.get("command")
    text = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {when}"
    return text + (f": {command}" if command else "")


def _read_holder(fd: int) -> dict | None:
    """The run the lock file names ({} when it names none readable; None when empty)."""
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 65536)
    if not raw.strip():
        return None
    try:
        holder = json.loads(raw)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _alive(holder: dict) -> bool | None:
    """Whether the process a lock names runs; None when it cannot be told (another host)."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def held(path: str) -> bool:
    """Whether a run may be holding `path`'s lock now: its lock file names a process that runs
    on this host, one on another host, or none readable (a run between creating the file and
    writing itself into it). False when there is no lock file or it names a process that has
    died. Read only: probing the lock with `flock` could make a run claiming it at that very
    moment fail."""
    try:
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        holder = _read_holder(fd)
    finally:
        os.close(fd)
    return not holder or _alive(holder) is not False


def _snapshot(path: str) -> dict[str, tuple[int, int]]:
    """The workdir's entries (not the lock): name -> (mtime_ns, size)."""
    found = {}
    with contextlib.suppress(OSError), os.scandir(path) as entries:
        for entry in entries:
            if entry.name == LOCK_NAME:
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                found[entry.name + ("/" if entry.is_dir() else "")] = (st.st_mtime_ns,
                                                                        st.st_size)
    return found


class Claim:
    """A run's hold on its workdir (see the module docstring); `release()` ends it."""

    def __init__(self, path: str, fd: int, created: list[str],
                 before: dict[str, tuple[int, int]]):
        self.path, self._fd, self.created, self._before = path, fd, created, before
        self._lock = os.path.join(path, LOCK_NAME)

    def written(self) -> list[str]:
        """Top-level entries this run added or changed (directories end in '/')."""
        now = _snapshot(self.path)
        return sorted(name for name, stamp in now.items() if self._before.get(name) != stamp)

    def release(self) -> None:
        """Removes the lock file (while holding the lock, so no one takes a lock on a file
        about to vanish: `_take_lock` checks it locked the file the path names), then any
        directory this run created that is still empty."""
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            os.unlink(self._lock)
        os.close(self._fd)
        self._fd = -1
        for directory in self.created:  # deepest first; rmdir refuses a non-empty one
            try:
                os.rmdir(directory)
            except OSError:
                break

    def discard(self) -> None:
        """Releases the claim and removes, with everything in it, the directory this run
        created (a partial output no one else wrote into: the lock kept others out); a
        directory that was there before is left as it is."""
        self.release()
        if self.created:
            shutil.rmtree(self.created[-1], ignore_errors=True)

    def kept(self) -> str:
        """One line: what the run left in the workdir (after `release`)."""
        written = self.written() if os.path.isdir(self.path) else []
        if not written:
            return f"nothing written to {self.path}"
        return f"{self.path} keeps what this run wrote before it stopped: {', '.join(written)}"


def _take_lock(path: str, lock: str, flag: str) -> tuple[int, dict | None]:
    """An open, flocked fd of `lock` and the run its content names (a run that did not
    release it); raises a UsageError naming the run that holds it."""
    for _ in range(20):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as e:
            raise _refuse(path, f"cannot write its lock file {LOCK_NAME} ({e.strerror})",
                          flag) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            holder = _read_holder(fd)
            os.close(fd)
            who = _describe(holder) if holder else "another run"
            raise _refuse(path, f"in use by {who}; wait for it to finish, or choose another "
                                f"{flag}", flag) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd, _read_holder(fd)
        os.close(fd)  # its holder removed that file as it released it: lock the new one
    raise _refuse(path, f"could not take its lock file {LOCK_NAME}", flag)


def claim(path: str, flag: str = FLAG) -> Claim:
    """Checks `path`, creates it if missing, and locks it for this run (see the module
    docstring). Raises a UsageError naming `flag`, leaving nothing behind, when it cannot."""
    check(path, flag)
    created = _missing_parents(path, flag)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise _refuse(path, f"cannot be created ({e.strerror})", flag) from None
    fd = -1
    try:
        before = _snapshot(path)
        fd, left = _take_lock(path, os.path.join(path, LOCK_NAME), flag)
        if left is not None:
            state = {False: "no longer running", None: "on another host"}.get(_alive(left),
                                                                              "not holding it")
            print(f"note: {flag}={path}: taking over the lock left by {_describe(left)} "
                  f"({state})", file=sys.stderr)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
              "command": " ".join(sys.argv)}
        if os.fstat(fd).st_size:  # a lock left behind: its holder's line goes. (Never an
            os.ftruncate(fd, 0)  # empty file's: ext4 then flushes the file when it is closed)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        return Claim(path, fd, created, before)
    except BaseException:
        if fd >= 0:
            Claim(path, fd, created, {}).release()
        else:
            for directory in created:
                try:
                    os.rmdir(directory)
                except OSError:
                    break
        raise


RESULTS = "results.json"
PREVIOUS = "previous"


def earlier_run(path: str, overwrite: bool, flag: str = FLAG) -> str | None:
    """A claimed workdir that holds an earlier run's results.json: refused (a UsageError
    saying what is there and from when), or with `overwrite` every entry but the lock and
    earlier `previous/` runs moved into `previous/<time>/`, so the new run's results,
    TensorBoard events and trace never mix with the earlier one's. Returns where they went,
    or None when there was no earlier run."""
    results = os.path.join(path, RESULTS)
    if not os.path.exists(results):
        return None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.path.getmtime(results)))
    try:
        with open(results) as f:
            job = json.load(f).get("job", "?")
    except (OSError, ValueError, AttributeError):
        job = "?"
    if not overwrite:
        raise _refuse(path, f"holds the results.json of an earlier run (job {job}, written "
                            f"{when}): give a new workdir, or --config.run.overwrite=True to "
                            f"move that run aside into {PREVIOUS}/", flag)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(os.path.getmtime(results)))
    aside = os.path.join(path, PREVIOUS, stamp)
    n = 1
    while os.path.exists(aside):
        n += 1
        aside = os.path.join(path, PREVIOUS, f"{stamp}-{n}")
    os.makedirs(aside)
    for entry in os.listdir(path):
        if entry not in (LOCK_NAME, PREVIOUS):
            shutil.move(os.path.join(path, entry), os.path.join(aside, entry))
    return aside


@contextlib.contextmanager
def claimed(path: str, flag: str = FLAG) -> Iterator[Claim]:
    """`claim(path, flag)` for the body; released however the body ends."""
    held = claim(path, flag)
    try:
        yield held
    finally:
        held.release()


RUNS = "runs"


def fresh(config: str, root: str = RUNS, now: float | None = None) -> str:
    """`root/<config name>-<YYYYmmdd-HHMMSS>` for the config file `config` (`PATH[:ARG]`; the
    argument, made file-name safe, joins the name), with `-2`, `-3`, ... where a run of the
    same second has the name already."""
    path, _, arg = config.partition(":")
    name = os.path.splitext(os.path.basename(path))[0] or "run"
    if arg:
        name += "-" + "".join(c if c.isalnum() or c in "._=-" else "_" for c in arg)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = os.path.join(root, f"{name}-{stamp}")
    candidate, n = base, 1
    while os.path.lexists(candidate):
        n += 1
        candidate = f"{base}-{n}"
    return candidate
