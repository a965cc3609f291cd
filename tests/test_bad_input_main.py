"""Issue 23, part A: every input a user can get wrong at `python -m moejax.main` and
`python -m moejax.convert` gets one line naming it (status 2 for a usage error, 1 for a failed
run, 130 for Ctrl-C), nothing is left behind by a run that wrote nothing, and nothing a user had
is overwritten: a workdir held by another run is refused, a failed `--add_precisions` leaves the
checkpoint as it was, result files get the mode a plain `open` gives.

Most cases run in this process (`cli.parse_flags` on flag values of their own, `workdir`,
`jobs.run`, the trace loader); the subprocess ones check what the command line prints.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
from absl import flags as absl_flags
from ml_collections import config_flags

from moejax import checkpoint, cli, jobs, workdir
from moejax.checkpoint import writer
from moejax.errors import ConfigError
from moejax.families import preset
from moejax.jobs.schema import base_config
from moejax.models.random_init import random_model
from moejax.results import write_json_atomic
from moejax.traces import format as trace_format

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")
TRACE = os.path.join(ROOT, "moejax", "assets", "traces", "code_0.npz")


def _command(module: str, *args: str, env: dict | None = None, timeout: int = 300):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


def _one_line_error(done, prog: str, status: int) -> str:
    """The run's one error line (asserting the status, and that nothing else was printed)."""
    assert done.returncode == status, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: "), done.stderr
    return lines[0]


# --- flags, config fields, config files (in process: cli.parse_flags) ------------------------

def _parse_error(tmp_path, *args: str, config: str | None = DEFAULT) -> str:
    """The UsageError message `python -m moejax.main`'s flag parsing gives for `args`."""
    argv = ["moejax.main"] + ([f"--config={config}"] if config is not None else []) + list(args)
    values = absl_flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv,
                                    lock_config=True)
    absl_flags.DEFINE_integer("group_size", 64, "", flag_values=values)
    # config_flags loads every config file as the module "config_config", reusing one already
    # loaded (a fresh process, as on the command line, has none).
    sys.modules.pop("config_config", None)
    with pytest.raises(cli.UsageError) as info:
        cli.parse_flags(argv, values)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message, message
    return message


def test_readme_typo_names_the_field_and_the_fix(tmp_path):
    assert _parse_error(tmp_path, "--config.run.max_new_token=8") == (
        "--config.run.max_new_token: the config declares no such field; did you mean "
        "max_new_tokens?")
    assert _parse_error(tmp_path, "--config.runn.max_new_tokens=8") == (
        "--config.runn.max_new_tokens: the config declares no config.runn; did you mean run?")
    assert _parse_error(tmp_path, "--config.run.zzz=1").startswith(
        "--config.run.zzz: the config declares no such field (moejax/jobs/schema.py")


@pytest.mark.parametrize("arg,message", [
    ("--config.run.max_new_tokens=abc", "--config.run.max_new_tokens=abc: takes an integer"),
    ("--config.run.max_new_tokens=1.5", "--config.run.max_new_tokens=1.5: takes an integer"),
    ("--config.run.stop_at_eos=maybe", "--config.run.stop_at_eos=maybe: takes true or false"),
    ("--config.cache.capacity_frac=lots", "--config.cache.capacity_frac=lots: takes a number"),
    ("--group_size=abc", "--group_size=abc: takes an integer"),
])
def test_value_of_the_wrong_type_names_what_the_flag_takes(tmp_path, arg, message):
    assert _parse_error(tmp_path, arg) == message


def _config_file(tmp_path, text: str) -> str:
    path = tmp_path / "my_config.py"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text,expected", [
    (None, ": no such file"),
    ("def get_config(:\n", ": SyntaxError: invalid syntax ({path}:1)"),
    ("def get_config(arg=None):\n    raise ValueError('scale must be full or tiny')\n",
     ": scale must be full or tiny"),
    ("x = 1\n", ": defines no get_config()"),
    ("def get_config(arg=None):\n    return undefined_name\n",
     ": does not load: NameError: name 'undefined_name' is not defined ({path}:2;"),
    ("directory", ": Is a directory"),
])
def test_config_file_that_does_not_load_is_one_line(tmp_path, text, expected):
    if text is None:
        path = str(tmp_path / "missing.py")
    elif text == "directory":
        path = str(tmp_path)
    else:
        path = _config_file(tmp_path, text)
    message = _parse_error(tmp_path, config=path)
    assert message.startswith(f"--config={path}{expected.format(path=path)}"), message
    # An override given with it changes nothing: the file is what is wrong.
    assert _parse_error(tmp_path, "--config.run.max_new_tokens=3", config=path) == message


# --- the workdir: checked before anything is written, removed again if the run created it ---

def test_workdir_that_cannot_be_used_is_refused_before_anything_is_written(tmp_path,
                                                                            monkeypatch):
    a_file = tmp_path / "results.txt"
    a_file.write_text("kept")
    with pytest.raises(cli.UsageError, match=f"^--workdir={a_file}: is a file, not a directory$"):
        workdir.claim(str(a_file))
    under = a_file / "run" / "deeper"
    with pytest.raises(cli.UsageError, match=f"^--workdir={under}: {a_file} is a file, not a "):
        workdir.claim(str(under))
    assert a_file.read_text() == "kept"

    target = tmp_path / "new" / "w"
    monkeypatch.setattr(os, "access", lambda *a, **k: False)  # a directory we may not write
    with pytest.raises(cli.UsageError, match=f"cannot be created: {tmp_path} is not writable"):
        workdir.claim(str(target))
    monkeypatch.undo()

    def refused(path, *a, **k):
        raise PermissionError(13, "Permission denied", path)
    monkeypatch.setattr(os, "makedirs", refused)
    with pytest.raises(cli.UsageError, match="cannot be created \\(Permission denied\\)"):
        workdir.claim(str(target))
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["results.txt"]


def test_config_error_leaves_no_workdir_behind(tmp_path):
    c = base_config()
    c.run.max_new_tokens = 0
    with pytest.raises(ConfigError, match="run.max_new_tokens=0"):
        jobs.run(c, str(tmp_path / "new" / "w"))
    assert os.listdir(tmp_path) == []  # both directories it created are gone
    existing = tmp_path / "mine"
    existing.mkdir()
    with pytest.raises(ConfigError):
        jobs.run(c, str(existing))
    assert existing.is_dir() and os.listdir(existing) == []  # was there: kept, lock removed
    c.job = "nope"  # refused before the job is looked up: a claim handed in goes too
    held = workdir.claim(str(existing))  # (a sweep's worker claims its cell's directory)
    with pytest.raises(ConfigError, match="config.job='nope'"):
        jobs.run(c, str(existing), claim=held)
    assert os.listdir(existing) == []
    workdir.claim(str(existing)).release()  # free again


# --- one run per workdir ---------------------------------------------------------------------

def test_second_claim_is_refused_naming_the_holder(tmp_path):
    w = str(tmp_path / "w")
    with workdir.claimed(w):
        with pytest.raises(cli.UsageError) as info:
            workdir.claim(w)
        assert f"--workdir={w}: in use by pid {os.getpid()} on " in str(info.value)
        c = base_config()  # the job door refuses too, before the job touches anything
        (tmp_path / "w" / "results.json").write_text("earlier run")
        with pytest.raises(cli.UsageError, match=f"in use by pid {os.getpid()}"):
            jobs.run(c, w)
        assert (tmp_path / "w" / "results.json").read_text() == "earlier run"
    assert os.listdir(w) == ["results.json"]  # the lock file went with the claim
    workdir.claim(w).release()  # free again


def test_lock_left_by_a_dead_run_is_taken_over_with_a_note(tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    w = tmp_path / "w"
    w.mkdir()
    (w / workdir.LOCK_NAME).write_text(json.dumps(
        {"pid": dead.pid, "host": os.uname().nodename, "started": time.time() - 60,
         "command": "python -m moejax.main --workdir=w " + "x" * 4096}))  # longer than ours
    held = workdir.claim(str(w))
    try:
        note = capsys.readouterr().err
        assert f"taking over the lock left by pid {dead.pid}" in note, note
        assert "no longer running" in note
        assert json.loads((w / workdir.LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        held.release()
    assert os.listdir(w) == []


def test_held_tells_a_live_runs_lock_from_a_dead_ones_without_taking_it(tmp_path):
    w = tmp_path / "w"
    w.mkdir()
    assert not workdir.held(str(w))  # no lock file
    with workdir.claimed(str(w)):
        assert workdir.held(str(w))  # this process holds it
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = w / workdir.LOCK_NAME
    lock.write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename}))
    assert not workdir.held(str(w))  # left by a run that died
    lock.write_text(json.dumps({"pid": os.getpid(), "host": "another-host.example"}))
    assert workdir.held(str(w))  # cannot be told: held
    lock.write_text("")
    assert workdir.held(str(w))  # a run writing itself into it
    workdir.claim(str(w)).release()  # probing took no lock: it can be claimed


# --- Ctrl-C ----------------------------------------------------------------------------------

def _interrupted(body) -> cli.Interrupted:
    """The `cli.Interrupted` that `body` ends with (caught as the KeyboardInterrupt it is, so
    that a plain one fails this test instead of stopping pytest)."""
    try:
        body()
    except KeyboardInterrupt as e:
        assert isinstance(e, cli.Interrupted), f"a bare {type(e).__name__}"
        return e
    raise AssertionError("not interrupted")


def test_ctrl_c_in_a_job_says_what_was_kept(tmp_path, monkeypatch):
    def job_writing_then_interrupted(config, w):
        with open(os.path.join(w, "trace.npz"), "w") as f:
            f.write("partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(jobs, "runner_of", lambda name: job_writing_then_interrupted)
    w = tmp_path / "w"
    stopped = _interrupted(lambda: jobs.run(base_config(), str(w)))
    assert stopped.kept == f"{w} keeps what this run wrote before it stopped: trace.npz"
    assert not (w / workdir.LOCK_NAME).exists()
    # A KeyboardInterrupt: a sweep worker's `except Exception` lets it through as Ctrl-C.
    assert not isinstance(stopped, Exception)

    def interrupted_at_once(config, w):
        raise KeyboardInterrupt

    monkeypatch.setattr(jobs, "runner_of", lambda name: interrupted_at_once)
    fresh = tmp_path / "fresh"
    stopped = _interrupted(lambda: jobs.run(base_config(), str(fresh)))
    assert stopped.kept == f"nothing written to {fresh}" and not fresh.exists()


@pytest.mark.slow
def test_ctrl_c_on_the_command_line_is_one_line_and_status_130(tmp_path):
    w = tmp_path / "w"
    # A suite started in the background (`cmd &` without job control) ignores SIGINT, and an
    # ignored signal stays ignored in a child: the command would never see the Ctrl-C. Any
    # handler here is the default in the child, where Python installs its own.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moejax.main", f"--config={DEFAULT}", f"--workdir={w}",
             "--config.run.max_new_tokens=400", "--config.log.progress=False"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, before)
    deadline = time.monotonic() + 120
    while not (w / workdir.LOCK_NAME).exists():  # the job has claimed its workdir: started
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and "Segmentation" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    left = sorted(os.listdir(w)) if w.exists() else []
    assert workdir.LOCK_NAME not in left
    if left:  # what it kept is named
        assert lines[0].startswith(f"moejax.main: interrupted; {w} keeps what this run wrote")
        assert all(name.rstrip("/") in lines[0] for name in left)
    else:
        assert lines[0] == f"moejax.main: interrupted; nothing written to {w}"


# --- the eval job without its extra ----------------------------------------------------------

def test_missing_extra_names_the_pip_command():
    missing = ModuleNotFoundError("No module named 'tensorflow'", name="tensorflow")
    assert cli.message_of(missing) == (
        "this needs tensorflow, which is in the 'eval' extra: pip install -e '.[eval]'", 1)
    core = ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")
    assert cli.message_of(core)[0].endswith("not installed: pip install -e .")


def test_eval_job_without_the_eval_extra(tmp_path):
    """TensorFlow missing where the eval job imports it (seqio's worker process): a package
    that raises as an absent one does stands in for it, on PYTHONPATH for both processes."""
    fake = tmp_path / "site" / "tensorflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'tensorflow'\", name='tensorflow')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    w = tmp_path / "w"
    done = _command("moejax.main", f"--config={ROOT}/configs/eval.py", f"--workdir={w}",
                    "--config.eval.task=gsm8k", "--config.eval.max_examples=1", env=env)
    line = _one_line_error(done, "moejax.main", 1)
    assert line.endswith("the 'eval' extra: pip install -e '.[eval]'"), line
    assert not w.exists()


# --- traces ----------------------------------------------------------------------------------

def _write(path, data: bytes):
    path.write_bytes(data)
    return str(path)


def _bad_traces(tmp_path) -> dict[str, tuple[str, str]]:
    raw = open(TRACE, "rb").read()
    flipped = bytearray(raw)
    with zipfile.ZipFile(TRACE) as z:  # a byte inside the first member's compressed data
        info = z.infolist()[0]
    flipped[info.header_offset + 30 + len(info.filename) + info.compress_size // 2] ^= 0xFF
    (tmp_path / "dir.npz").mkdir()
    with np.load(TRACE) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["meta"]))
    bad_meta = dict(arrays, meta=np.asarray(json.dumps(dict(meta, num_experts="sixty"))))
    np.savez(tmp_path / "bad_meta.npz", **bad_meta)
    np.savez(tmp_path / "floats.npz", **dict(arrays, tokens=arrays["tokens"] + 0.5))
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    return {
        "cut": (_write(tmp_path / "cut.npz", raw[:len(raw) // 2]),
                "not a complete .npz trace (cut short?)"),
        "corrupt": (_write(tmp_path / "corrupt.npz", bytes(flipped)), "a corrupt .npz trace"),
        "empty": (_write(tmp_path / "empty.npz", b""), "empty (0 bytes)"),
        "directory": (str(tmp_path / "dir.npz"), "is a directory"),
        "missing": (str(tmp_path / "missing.npz"), "not readable: No such file"),
        "wrong arrays": (str(tmp_path / "other.npz"), "missing arrays ['meta', "),
        "bad meta": (str(tmp_path / "bad_meta.npz"),
                     "meta num_experts='sixty' is not a positive integer"),
        "float tokens": (str(tmp_path / "floats.npz"), "tokens have dtype float64"),
    }


def test_every_bad_trace_file_is_named(tmp_path):
    for name, (path, what) in _bad_traces(tmp_path).items():
        with pytest.raises(trace_format.TraceError) as info:
            trace_format.load(path)
        assert str(info.value).startswith(f"{path}: {what}"), (name, str(info.value))


def test_cut_trace_on_the_command_line(tmp_path):
    cut = _write(tmp_path / "cut.npz", open(TRACE, "rb").read()[:1000])
    w = tmp_path / "w"
    done = _command("moejax.main", f"--config={ROOT}/configs/replay.py", f"--workdir={w}",
                    f"--config.replay.trace={cut}")
    line = _one_line_error(done, "moejax.main", 2)
    assert line == (f"moejax.main: error: {cut}: not a complete .npz trace (cut short?): "
                    "File is not a zip file"), line
    assert not w.exists()


# --- results files ---------------------------------------------------------------------------

def test_write_json_atomic_gives_the_mode_open_would(tmp_path):
    old = os.umask(0o022)
    try:
        write_json_atomic(str(tmp_path / "results.json"), {"a": 1})
        assert oct(os.stat(tmp_path / "results.json").st_mode & 0o777) == oct(0o644)
        os.umask(0o027)
        write_json_atomic(str(tmp_path / "other.json"), {"a": 1})
        assert oct(os.stat(tmp_path / "other.json").st_mode & 0o777) == oct(0o640)
        os.chmod(tmp_path / "results.json", 0o664)  # an existing file keeps its own
        write_json_atomic(str(tmp_path / "results.json"), {"a": 2})
        assert oct(os.stat(tmp_path / "results.json").st_mode & 0o777) == oct(0o664)
    finally:
        os.umask(old)
    assert json.loads((tmp_path / "results.json").read_text()) == {"a": 2}
    assert sorted(os.listdir(tmp_path)) == ["other.json", "results.json"]  # no temporaries


# --- convert --add_precisions that fails part-way --------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    return random_model(preset("olmoe", "tiny"), seed=2)


def _quantized(path: str, precision: str):
    ck = checkpoint.load(path)
    gu, dn = ck.experts_at(precision)
    return {(layer, kind, part): np.asarray(getattr(host[layer], part))
            for layer in ck.cfg.moe_layers for kind, host in (("gate_up", gu), ("down", dn))
            for part in ("values", "scale", "zero")}


@pytest.mark.parametrize("layout", ["zarr", "packed"])
def test_add_precisions_failing_part_way_leaves_the_checkpoint_as_it_was(tiny, tmp_path,
                                                                         monkeypatch, layout):
    model, gate_up, down = tiny
    out = str(tmp_path / "ckpt")
    # minmax: the calibration quickest to compile (the default, search, takes seconds per
    # shape); what is checked here does not depend on the calibration.
    checkpoint.save_model(out, model, gate_up, down, precisions=("int4",), group_size=16,
                          calibration="minmax", expert_layout=layout)
    config_before = open(os.path.join(out, "config.json"), "rb").read()
    int4_before = _quantized(out, "int4")
    real_write = writer.ExpertWriter.write
    layers_written = []

    def failing_write(self, layer, precision, weights, compression):
        if layers_written and layer != layers_written[0]:
            raise OSError(28, "No space left on device")  # after the first layer
        layers_written.append(layer)
        real_write(self, layer, precision, weights, compression)

    monkeypatch.setattr(writer.ExpertWriter, "write", failing_write)
    # Replacing int4 (another group size) and adding int2: both fail after the first layer.
    for precisions in (["int4"], ["int2"]):
        layers_written.clear()
        with pytest.raises(OSError, match="No space left"):
            checkpoint.add_precisions(out, precisions, group_size=8, calibration="minmax")
        assert open(os.path.join(out, "config.json"), "rb").read() == config_before
        assert not os.path.exists(os.path.join(out, writer.STAGING))  # staged copies removed
    assert list(checkpoint.read_precisions(out)) == ["native", "int4"]
    after = _quantized(out, "int4")  # the old int4 copy, whole
    assert after.keys() == int4_before.keys()
    for key, value in int4_before.items():
        np.testing.assert_array_equal(after[key], value)
    monkeypatch.undo()
    assert list(checkpoint.add_precisions(out, ["int2"], group_size=8, calibration="minmax")) \
        == ["native", "int4", "int2"]


# --- the command lines: main and convert -----------------------------------------------------

@pytest.mark.parametrize("module, flag", [("moejax.main", "--workdir"),
                                          ("moejax.convert", "--hf_dir")])
def test_help_is_an_answer_with_status_0(module, flag):
    """absl exits 1 after printing the usage for --help; asked for, it is not a failure."""
    for ask in ("--help", "--helpfull"):
        done = _command(module, ask)
        assert done.returncode == 0, (ask, done.returncode, done.stderr[-2000:])
        assert flag in done.stdout + done.stderr and "Traceback" not in done.stderr
    assert cli.asks_for_help(["--config=c.py", "--help"])
    assert not cli.asks_for_help(["--", "--help"]) and not cli.asks_for_help(["--helpme"])


def test_main_command_line_errors_are_one_line(tmp_path):
    w = tmp_path / "w"
    typo = _command("moejax.main", f"--config={DEFAULT}", f"--workdir={w}",
                    "--config.run.max_new_token=8")
    assert _one_line_error(typo, "moejax.main", 2) == (
        "moejax.main: error: --config.run.max_new_token: the config declares no such field; "
        "did you mean max_new_tokens?")
    missing = _command("moejax.main", "--config=configs/nonexistent.py", f"--workdir={w}")
    assert _one_line_error(missing, "moejax.main", 2) == (
        "moejax.main: error: --config=configs/nonexistent.py: no such file")
    unknown_job = _command("moejax.main", f"--config={DEFAULT}", f"--workdir={w}",
                           "--config.job=generat")
    assert "config.job='generat' is not one of" in _one_line_error(unknown_job, "moejax.main", 2)
    a_file = tmp_path / "a_file"
    a_file.write_text("kept")
    on_file = _command("moejax.main", f"--config={DEFAULT}", f"--workdir={a_file}")
    assert _one_line_error(on_file, "moejax.main", 2) == (
        f"moejax.main: error: --workdir={a_file}: is a file, not a directory")
    assert sorted(os.listdir(tmp_path)) == ["a_file"] and a_file.read_text() == "kept"


def test_second_run_into_a_held_workdir_is_refused(tmp_path):
    w = tmp_path / "w"
    w.mkdir()
    (w / "results.json").write_text("the first run's")
    with workdir.claimed(str(w)):
        done = _command("moejax.main", f"--config={DEFAULT}", f"--workdir={w}")
    line = _one_line_error(done, "moejax.main", 2)
    assert line.startswith(f"moejax.main: error: --workdir={w}: in use by pid {os.getpid()} "), \
        line
    assert os.listdir(w) == ["results.json"]
    assert (w / "results.json").read_text() == "the first run's"


def test_convert_usage_errors(tiny, tmp_path):
    model, gate_up, down = tiny
    out = str(tmp_path / "ckpt")
    checkpoint.save_model(out, model, gate_up, down)
    before = open(os.path.join(out, "config.json"), "rb").read()
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    onto = _command("moejax.convert", f"--hf_dir={hf}", f"--out={out}")
    assert _one_line_error(onto, "moejax.convert", 2) == (
        f"moejax.convert: error: --out={out}: holds a moejax checkpoint already; choose another "
        "--out, or remove it first (--add_precisions adds copies to it)")
    assert open(os.path.join(out, "config.json"), "rb").read() == before
    bare = _command("moejax.convert")
    assert _one_line_error(bare, "moejax.convert", 2) == (
        "moejax.convert: error: --hf_dir and --out are required (--help lists the flags)")
