"""One error path for every entry point: a user's mistake ends in one or two lines naming the
input and what it takes, never a traceback.

Exit status: `USAGE` (2) for a mistake in what was typed or pointed at (a flag, a config
field, a path), `FAILED` (1) for a run that started and failed (a corrupt checkpoint found
mid-run, a disk full, a result that differs from the run's own check of it), `INTERRUPTED`
(130) for Ctrl-C, with one line saying what was kept.
Setting `MOEJAX_DEBUG=1` in the environment (or `--debug` where an entry point offers it)
re-raises instead, so a developer sees the traceback.

Entry points wrap their body in `guarded` (argparse ones) or start through `run_absl`
(absl ones: `moejax.main`, `moejax.convert`), whose flag parser turns a bad flag, a config
file that does not load and an undeclared config field into a usage error.

Naming the flag, field or file at fault needs what ml_collections' config_flags knew when it
raised, which its exceptions do not carry: the parser reads it from the frames of the
traceback (`_config_file_arg`, `_override_field`, `_flag_parser`) and from config_flags' own
classes (`PRIVATE_API`). Those are private to ml_collections and absl, so pyproject pins both
to the minor versions this was written against, and `tests/test_cli_private_api.py` fails,
naming what moved, when an upgrade changes any of them.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import math
import os
import re
import shlex
import signal
import sys
import threading
from typing import Callable, NoReturn

from moejax import errors
from moejax.errors import CheckFailed, CheckpointError, ConfigError, UsageError

USAGE, FAILED, INTERRUPTED = 2, 1, 130

# What this module reads of ml_collections.config_flags' private classes: class name ->
# (attributes or parameters it relies on). Checked by tests/test_cli_private_api.py.
PRIVATE_API = {
    "ConfigFileFlagParser": ("parse(path)", "name"),
    "_ConfigFlag": ("value",),
    "_ConfigFieldFlag": ("name", "parser"),
    "_ConfigFieldMultiFlag": ("name", "parser"),
    "_ErrorConfig": ("_error",),
}
DEBUG_ENV = "MOEJAX_DEBUG"

# Optional extras (pyproject.toml) a job or tool imports lazily: the module -> its extra.
EXTRAS = {"seqio": "eval", "tensorflow": "eval", "tensorflow_datasets": "eval",
          "t5": "eval", "transformers": "test", "torch": "test", "tensorboard": "test",
          "hypothesis": "test", "safetensors": "test", "bigrig": "bench"}
# moejax's own dependencies, by module: one missing is an incomplete install.
DEPENDENCIES = {"jax", "jaxlib", "flax", "orbax", "tensorstore", "numpy", "ml_dtypes", "absl",
                "ml_collections", "tokenizers", "tqdm", "optax", "tensorboardX", "matplotlib",
                "qwix", "numba"}


class Interrupted(KeyboardInterrupt):
    """Raised by code that handles Ctrl-C itself and knows what it kept (`kept`). A
    KeyboardInterrupt, so that code catching `Exception` (a sweep's worker recording a failed
    cell) lets it through as it lets Ctrl-C through."""

    def __init__(self, kept: str):
        super().__init__(kept)
        self.kept = kept


def debug() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def program() -> str:
    """The running program's name as its user typed it (`moejax.main` for `python -m
    moejax.main`), the prefix of this module's lines."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        return spec.name.removesuffix(".__main__")
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "moejax"


def warn(message: str) -> None:
    """One warning line on stderr, `prog: warning: message` (the errors' format)."""
    print(f"{program()}: warning: {message}", file=sys.stderr)


errors.set_warning_printer(warn)  # library warnings in this entry point's format


def fail(prog: str, message: str, status: int = USAGE) -> NoReturn:
    """Prints `prog: error: message` on stderr and exits with `status`."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    if not sys.stdout.closed:
        sys.stdout.flush()
    raise SystemExit(status)


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    if isinstance(e, KeyError) and text.startswith(("'", '"')):
        text = text.strip("'\"").replace("\\n", " ").replace('\\"', '"')
    return text


def message_of(e: BaseException) -> tuple[str, int] | None:
    """The one-line message and exit status a user gets for `e`; None for a defect (a bug:
    its traceback is shown)."""
    if isinstance(e, UsageError):
        return _one_line(e), USAGE
    if isinstance(e, ConfigError):
        return _one_line(e), USAGE
    if isinstance(e, (CheckpointError, CheckFailed)):
        return _one_line(e), FAILED
    if isinstance(e, ModuleNotFoundError) and e.name:
        return _missing_module_message(e)
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{e.filename or 'disk'}: no space left ({e.strerror})", FAILED
    if isinstance(e, OSError) and e.filename is not None and e.errno in (
            errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR,
            errno.EEXIST, errno.EROFS, errno.ENAMETOOLONG):
        return f"{e.filename}: {e.strerror}", USAGE
    return None


def _missing_module_message(e: ModuleNotFoundError) -> tuple[str, int] | None:
    """An extra or a dependency not installed (or installed without its own dependencies:
    the module is missing while an extra's package imports); None for anything else."""
    top = e.name.split(".")[0]
    if top in EXTRAS:
        extra = EXTRAS[top]
        return (f"this needs {top}, which is in the '{extra}' extra: "
                f"pip install -e '.[{extra}]'"), FAILED
    if top in DEPENDENCIES:
        return (f"this needs {top}, a dependency of moejax that is not installed: "
                f"pip install -e ."), FAILED
    tb = e.__traceback__
    while tb is not None:  # importing an extra's package, which needs a module it lacks
        parts = tb.tb_frame.f_code.co_filename.split(os.sep)
        extra = next((EXTRAS[p] for p in parts if p in EXTRAS), None)
        if extra is not None and "site-packages" in parts:
            return (f"the '{extra}' extra is incomplete ({e.name} is missing): "
                    f"pip install -e '.[{extra}]'"), FAILED
        tb = tb.tb_next
    return None


def _quiet_broken_pipe() -> None:
    """The reader of our stdout went away (`... | head`): stop quietly, as `cat` does."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


def _in_dropping_context(frame) -> bool:
    """Whether Python would print and drop an exception raised in `frame`: a garbage
    collector callback (JAX registers one) or a `__del__`, up the stack."""
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def _ctrl_c_not_lost():
    """Ctrl-C as Python's own handler (KeyboardInterrupt), except that one landing in a
    context that drops exceptions (a gc callback: the run went on to finish with status 0)
    is delivered again a moment later, outside it. Left as is where SIGINT is ignored or
    handled by someone else, and off the main thread."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return

    def on_sigint(signum, frame):
        if _in_dropping_context(frame):
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def guarded(prog: str, body: Callable[[], int | None], *,
            kept: Callable[[], str] | None = None) -> int:
    """Runs `body()`; returns its status (None: 0). A user's mistake prints one line and
    returns its status; Ctrl-C prints what was kept (`kept()`, or an `Interrupted`'s) and
    returns 130. A defect's traceback is shown. `MOEJAX_DEBUG=1` re-raises everything."""
    try:
        with _ctrl_c_not_lost():
            status = body()
        return 0 if status is None else int(status)
    except SystemExit:
        raise
    except BrokenPipeError:
        _quiet_broken_pipe()
        return 0
    except (KeyboardInterrupt, Interrupted) as e:
        if debug():
            raise
        what = e.kept if isinstance(e, Interrupted) else (kept() if kept else "")
        print(f"{prog}: interrupted" + (f"; {what}" if what else ""), file=sys.stderr)
        return INTERRUPTED
    except Exception as e:  # noqa: BLE001 - sorted into a user's mistake or a defect below
        if _from_ctrl_c(e) and not debug():
            # Ctrl-C while a C extension initialises (tensorstore, ml_dtypes: the first
            # seconds of a run) surfaces as "ImportError: initialization failed" raised from
            # the KeyboardInterrupt: it is the Ctrl-C, and says so.
            print(f"{prog}: interrupted" + (f"; {kept()}" if kept and kept() else ""),
                  file=sys.stderr)
            return INTERRUPTED
        found = message_of(e)
        if found is None or debug():
            raise
        text, status = found
        print(f"{prog}: error: {text}", file=sys.stderr)
        return status


def _from_ctrl_c(e: BaseException) -> bool:
    """Whether `e` was raised from or while handling a KeyboardInterrupt."""
    return any(isinstance(c, KeyboardInterrupt) for c in _chain(e)[1:])


def run_absl(prog: str, main: Callable[[list[str]], int | None], *,
             kept: Callable[[], str] | None = None) -> NoReturn:
    """`absl.app.run(main)` with one error path: a flag that does not parse, a config file
    that does not load (missing, a syntax error, `get_config` raising) and an undeclared
    config field or a value of the wrong type are usage errors (status 2), each one line
    naming the flag as typed."""
    from absl import app

    def parse(argv: list[str]) -> list[str]:
        try:
            return parse_flags(argv)
        except UsageError as e:
            fail(prog, str(e), USAGE)
        except SystemExit as e:
            # absl prints the usage for --help and its kin and exits 1; asked for, the usage
            # is an answer, not a failure.
            if e.code == 1 and asks_for_help(argv[1:]):
                raise SystemExit(0) from None
            raise

    def body(argv: list[str]) -> None:
        def call():
            try:
                return main(argv)
            except app.UsageError as e:
                raise UsageError(f"{e} (--help lists the flags)") from None
        status = guarded(prog, call, kept=kept)
        if status == INTERRUPTED and not debug():
            # Ctrl-C can land while XLA still runs work on threads of its own; the
            # interpreter's teardown around them has crashed (a segfault after the line
            # above). Nothing is left to clean up: flush and leave at once.
            _flush_std()
            os._exit(INTERRUPTED)
        raise SystemExit(status)

    app.run(body, flags_parser=parse)
    raise AssertionError("absl.app.run returned")


HELP_FLAGS = ("--help", "-help", "-?", "--helpshort", "-helpshort", "--helpfull",
              "-helpfull", "--helpxml", "-helpxml")


def asks_for_help(args: list[str]) -> bool:
    """Whether `args` (without the program) hold one of absl's help flags before a `--`."""
    for arg in args:
        if arg == "--":
            return False
        if arg in HELP_FLAGS:
            return True
    return False


def parse_flags(argv: list[str], flag_values=None) -> list[str]:
    """`flag_values(argv)` (absl's global FLAGS by default): the arguments left over, or a
    UsageError whose message names the flag, config field or config file at fault."""
    from absl import flags, logging

    flag_values = flags.FLAGS if flag_values is None else flag_values
    # config_flags logs a get_config() that returns None as a warning before flags are
    # parsed; the one line below says it instead.
    verbosity = logging.get_verbosity()
    logging.set_verbosity(logging.ERROR)
    try:
        remaining = flag_values(argv)
    except Exception as e:  # noqa: BLE001 - all of it is what the user typed or named
        if debug():
            raise
        raise UsageError(flag_error_message(e)) from None
    finally:
        # The user's own --verbosity (-v) stands; otherwise the level from before parsing.
        if "verbosity" not in flag_values or not flag_values["verbosity"].present:
            logging.set_verbosity(verbosity)
    # config_flags defers a config file that does not load to the first use of the config
    # (an `_ErrorConfig` placeholder): surface it now, before anything runs.
    for name in list(flag_values):
        failed = _config_load_failure(flag_values[name].value)
        if failed is not None:
            if debug():
                raise failed
            raise UsageError(_config_file_message(name, argument_of(name, argv), failed))
        given = argument_of(name, argv)
        if type(flag_values[name]).__name__ == "_ConfigFlag" and given:
            _check_config_value(name, given, flag_values[name].value)
    return remaining


def _check_config_value(name: str, argument: str, value) -> None:
    """A config file's get_config() returns an ml_collections.ConfigDict: anything else is
    one line, naming what it returned."""
    import ml_collections

    if isinstance(value, ml_collections.ConfigDict):
        return
    what = "None (no return statement?)" if value is None else f"a {type(value).__name__}"
    raise UsageError(f"--{name}={argument}: get_config() returned {what}, not an "
                     "ml_collections.ConfigDict (start from moejax.jobs.schema.base_config() "
                     "and return it)")


def argument_of(name: str, argv: list[str]) -> str:
    """What `--name` was given on the command line (the last one wins, as in absl)."""
    found = ""
    for i, arg in enumerate(argv):
        for prefix in (f"--{name}", f"-{name}"):
            if arg.startswith(prefix + "="):
                found = arg[len(prefix) + 1:]
            elif arg == prefix and i + 1 < len(argv):
                found = argv[i + 1]
    return found


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


# --- what absl / ml_collections raised while parsing the command line, as one line ---

def _chain(e: BaseException) -> list[BaseException]:
    """`e` and the exceptions it was raised from or while handling, outermost first."""
    seen: list[BaseException] = []
    while e is not None and all(e is not s for s in seen):
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def _frames(e: BaseException):
    tb = e.__traceback__
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def _config_file_arg(chain: list[BaseException]) -> tuple[str, str] | None:
    """(flag name, argument) when the error was raised loading a config file
    (`ConfigFileFlagParser.parse`)."""
    for e in chain:
        for frame, _ in _frames(e):
            owner = frame.f_locals.get("self")
            if (frame.f_code.co_name == "parse" and "path" in frame.f_locals
                    and type(owner).__name__ == "ConfigFileFlagParser"):
                return owner.name, frame.f_locals["path"]
    return None


def _override_field(chain: list[BaseException]) -> tuple[str, object] | None:
    """(`config.run.max_new_token`, the field's value parser or None) when the error was
    raised by config_flags resolving or parsing an override of a config field."""
    for e in chain:
        for frame, _ in _frames(e):
            owner = frame.f_locals.get("self")
            kind = type(owner).__name__
            if kind in ("_ConfigFieldFlag", "_ConfigFieldMultiFlag"):
                return owner.name, getattr(owner, "parser", None)
            if kind == "_ConfigFlag":
                path = frame.f_locals.get("field_path") or frame.f_locals.get("override")
                if isinstance(path, str):
                    return f"{owner.name}.{path}", None
    return None


# What a config field's value parser takes, by parser class (config_flags picks the parser
# from the declared value's type).
_TAKES = {"IntegerParser": "an integer", "FloatParser": "a number",
          "BooleanParser": "true or false", "TupleParser": "a tuple, e.g. '(1, 2)'",
          "_ConfigDictParser": "a dict of the section's fields"}


def _where(e: BaseException) -> str:
    """`file:line` where `e` was raised, leaving out the flag libraries' frames (a syntax
    error: where it is)."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{e.filename}:{e.lineno}"
    found = ""
    for frame, line in _frames(e):
        path = frame.f_code.co_filename
        if path != __file__ and not any(lib in path for lib in (
                f"{os.sep}absl{os.sep}", "ml_collections", "<frozen")):
            found = f"{path}:{line}"
    return found


def flag_error_message(e: BaseException) -> str:
    """What the flag parser raised, as one line naming the flag as typed and what it takes."""
    chain = _chain(e)
    loading = _config_file_arg(chain)
    if loading is not None:
        return _config_file_message(*loading, chain[-1], chain)
    failed = next((c for c in chain if _is_load_failure(c)), None)
    override = _override_field(chain)
    if failed is not None:  # an override of a config whose file did not load
        return _config_file_message(override[0].split(".")[0] if override else "config", "",
                                    failed)
    if override is not None and isinstance(chain[-1], (KeyError, AttributeError)):
        return _undeclared_field_message(override[0], chain)
    text = " ".join(_one_line(e).split())
    if text.startswith("flag --"):
        text = text[len("flag "):]
    parser = override[1] if override is not None else _flag_parser(chain)
    takes = _TAKES.get(type(parser).__name__)
    if takes and text.startswith("--"):  # a value that does not parse as the flag's type
        return f"{text.split(': ', 1)[0]}: takes {takes}"
    if override is not None:
        return f"{text} (the field's type is declared in moejax/jobs/schema.py)"
    return f"{text} (--help lists the flags)"


def _flag_parser(chain: list[BaseException]):
    """The value parser of the absl flag being parsed when the error was raised, or None."""
    from absl import flags

    for e in chain:
        for frame, _ in _frames(e):
            owner = frame.f_locals.get("self")
            if isinstance(owner, flags.Flag):
                return getattr(owner, "parser", None)
    return None


# Config fields that moved into their job's section: the old dotted name -> the new one as a
# config names it (`moejax.jobs.schema.MOVED`), set by the door that defines `--config`
# (`moejax.main`: this module imports no job), so a flag naming an old field names the new.
MOVED_FIELDS: dict[str, str] = {}


def set_moved_fields(moved: dict[str, str]) -> None:
    MOVED_FIELDS.clear()
    MOVED_FIELDS.update(moved)


# -- command lines a user can paste -----------------------------------------------------------
def flag_value(value: str | int | float | bool) -> str:
    """A value as ml_collections' flag parsers read it for a field of the value's type."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)  # inf, -inf, nan
    return value


def bash_quote(s: str) -> str:
    """shlex.quote, or ANSI-C `$'...'` quoting when `s` holds control characters, so every
    command stays on one line (a sweep's cells.txt, the planner's command lines)."""
    if s.isprintable():
        return shlex.quote(s)
    out = []
    for ch in s:
        if ch in "\\'":
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return "$'" + "".join(out) + "'"


def config_flag(field: str, value: str | int | float | bool) -> str:
    """`--config.FIELD=VALUE`, quoted for a shell."""
    return bash_quote(f"--config.{field}={flag_value(value)}")


def as_flags(text: str, flag: str) -> str:
    """`text` with each dotted field name in it as the flag that sets it (`flag`
    `--config`): `replay.trace` -> `--config.replay.trace`."""
    return re.sub(r"\b([a-z_]+(?:\.[a-z_0-9]+)+)", lambda m: f"{flag}.{m.group(1)}", text)


def _undeclared_field_message(field: str, chain: list[BaseException]) -> str:
    """`--config.run.max_new_token: the config declares no such field; did you mean
    max_new_tokens?` (config_flags raises a KeyError / AttributeError of the first missing
    name, with ConfigDict's "Did you mean"); a field that moved into its job's section
    (`MOVED_FIELDS`): `--config.trace: moved to --config.replay.trace`."""
    flag, _, path = field.partition(".")
    if path in MOVED_FIELDS:
        return f"--{field}: moved to {as_flags(MOVED_FIELDS[path], f'--{flag}')}"
    missing, suggestion = None, None
    for e in chain:
        text = str(e.args[0]) if e.args else ""
        first = re.match(r"""\W*(\w+)""", text)
        if missing is None and first:
            missing = first.group(1)
        hint = re.search(r'Did you mean "([^"]+)"', text)
        if hint and suggestion is None:
            suggestion = hint.group(1)
    parts = field.split(".")
    if missing in parts[1:-1]:  # a section that does not exist: name it
        section = ".".join(parts[:parts.index(missing, 1) + 1])
        message = f"--{field}: the config declares no {section}"
    else:
        message = f"--{field}: the config declares no such field"
    if suggestion:
        return f"{message}; did you mean {suggestion}?"
    return f"{message} (moejax/jobs/schema.py declares the fields)"


def _is_load_failure(e: BaseException) -> bool:
    return isinstance(e, OSError) and (
        str(e).startswith("Failed loading config file")
        or "earlier failure to load" in str(e))


def _config_load_failure(value) -> BaseException | None:
    """The error of a config file config_flags could not load (its `_ErrorConfig` placeholder
    raises it on first use); None for anything else."""
    if type(value).__name__ != "_ErrorConfig":
        return None
    return vars(value).get("_error") or OSError("Failed loading config file")


def _config_file_message(name: str, argument: str, e: BaseException,
                         chain: list[BaseException] = ()) -> str:
    """`--config=PATH: ...` for a config file that does not load: missing or unreadable, a
    syntax error, or `get_config` raising (its message; where, for what is likely a bug).
    `chain`: the exceptions `e` came out of (the file's own frame is in one of them)."""
    flag = f"--{name}={argument}" if argument else f"--{name}"
    path = argument.split(":", 1)[0]
    if not path:
        return f"{flag}: names no file (--{name}=configs/NAME.py)"
    if _is_load_failure(e):  # config_flags' own wrapper: the path's error is inside
        if path and not os.path.lexists(path):
            return f"{flag}: no such file"
        inner = next((c for c in _chain(e) if isinstance(c, OSError) and c.strerror), None)
        return f"{flag}: {inner.strerror}" if inner else f"{flag}: does not load"
    if isinstance(e, OSError) and e.strerror:
        return f"{flag}: {e.strerror}"
    if isinstance(e, SyntaxError):
        return f"{flag}: {type(e).__name__}: {e.msg} ({_where(e)})"
    if isinstance(e, AttributeError) and getattr(e, "name", None) == "get_config":
        return f"{flag}: defines no get_config() (a config file returns its config from it)"
    text = " ".join(_one_line(e).split())
    if isinstance(e, (ValueError, TypeError, KeyError)):  # get_config rejecting its argument
        # ml_collections' type error names no field: the file's own line does.
        line = _line_in([*chain, e], path)
        return f"{flag}: {text}" + (f" (at {line})" if line else "")
    where = _where(e)
    return (f"{flag}: does not load: {type(e).__name__}: {text} "
            f"({where + '; ' if where else ''}{DEBUG_ENV}=1 shows the traceback)")


def _line_in(errors: list[BaseException], path: str) -> str:
    """`NAME.py:LINE: source` of the last frame in the file `path` of `errors` (and what each
    was raised from), or ""."""
    import linecache
    import traceback

    target = os.path.abspath(path)
    found = ""
    chained = [c for error in errors for c in _chain(error)]
    for error in chained:  # config_flags re-raises the file's error, which holds its frame
        for frame in traceback.extract_tb(error.__traceback__):
            if os.path.abspath(frame.filename) == target:
                source = (frame.line or linecache.getline(frame.filename, frame.lineno))
                found = f"{os.path.basename(path)}:{frame.lineno}: {source.strip()}"
    # A config that raises on purpose said what it had to say: its `raise` line adds nothing.
    return "" if found.split(": ", 1)[-1].startswith("raise ") else found


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the one error path: a bad flag prints one line (`prog: error: ... (--help
    lists the flags)`) and exits 2, instead of the usage block first."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (--help lists the flags)", USAGE)
