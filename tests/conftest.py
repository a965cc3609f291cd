"""Test-suite setup.

Two loops:

* the whole suite — the README's test command and CI: `python -m pytest -q -rs -n 2 --dist
  loadfile` (pytest-xdist: one test module per worker, each worker its own process with its
  own JAX; README's "run the whole test suite" says how long it takes, measured);
* the quick loop while working: `python -m pytest -q -m "not slow" -n 2 --dist loadfile`
  (README says how long it takes, measured). It leaves out the tests marked `slow`: runs of
  the command line in a subprocess, sweeps through the process pool, training, the
  transformers parity cases, complete jobs end to end (generate with warm-up, profile,
  replays of the real captures, a live run then its replay), and scoring whole evaluation
  texts with the embedded model. The unit and
  property tests of every part stay in it.

Nothing here skips: the test extra installs everything the tests import, and the data they
read is committed in the repository (`moejax/assets/`).

Property tests run under a pinned hypothesis profile, so every run (CI's included) draws the
same examples: `ci` (the default) derandomizes and keeps no example database. A deeper local run
draws fresh examples, more of them: `HYPOTHESIS_PROFILE=deep MOEJAX_FUZZ_SCALE=20 python -m
pytest tests/test_compiled_replay.py` (each test's example count is `tests/fuzzing.py`'s
`examples(n)`, n times the scale).

Most of the suite's time is XLA compiling the tiny models' steps. Compiled executables are kept
in JAX's persistent compilation cache under pytest's own cache directory
(`.pytest_cache/d/jax`, ignored by git; `-p no:cacheprovider` turns it off), so a second run of
either loop compiles almost nothing. Results cannot depend on it: a cache entry is keyed by the
computation, the compile options and the JAX/XLA version.
"""

from __future__ import annotations

import os
import sys
import types

import pytest
from hypothesis import HealthCheck, settings

# TensorBoard's event reader (EventAccumulator, used to read back the events the jobs write)
# imports TensorFlow when it is installed — and the `eval` extra installs it. TensorFlow must not
# share a process with JAX's compilations (it segfaulted the suite inside the persistent
# compilation cache; docs/findings/quality.md, issue 11), so the reader gets TensorBoard's own stub: an
# importable `tensorboard.compat.notf` is TensorBoard's documented switch for that.
sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Memory mappings of the test process above which compiled executables are dropped.
MAX_MAPS = 25_000


def _maps() -> int:
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux: no such limit to watch
        return 0


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_steps():
    """Drops every compiled executable after a test module once the process holds more than
    MAX_MAPS memory mappings. An XLA CPU executable keeps mappings of its code until it is
    freed, and the suite compiles thousands (every tiny model, shape and policy path): kept
    for the whole run they passed Linux's `vm.max_map_count` (65530), and the failed mmap
    surfaced as a segfault inside XLA (docs/findings/quality.md, issue 11). A later module that needs a
    step again reads it back from the persistent cache below."""
    yield
    if _maps() > MAX_MAPS:
        import jax

        jax.clear_caches()


def pytest_configure(config):
    if config.pluginmanager.hasplugin("cacheprovider"):
        import jax

        jax.config.update("jax_compilation_cache_dir", str(config.cache.mkdir("jax")))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    config.addinivalue_line(
        "markers", "slow: heavy (subprocess runs, sweeps, training, parity, complete jobs); "
        "still part of the default run, left out of the quick loop by -m 'not slow'")


@pytest.fixture(scope="session")
def subprocess_env(pytestconfig) -> types.MappingProxyType:
    """The environment for a test's `python -m ...` subprocess: this one's, with the suite's
    persistent compilation cache (above) where it is on, so that a subprocess reads the steps
    the suite already compiled instead of compiling them again (results cannot depend on it).
    One for the session (a module-scoped fixture may use it too), read-only: a test that needs
    more copies it (`{**subprocess_env, ...}`)."""
    env = dict(os.environ)
    if pytestconfig.pluginmanager.hasplugin("cacheprovider"):
        env.update(JAX_COMPILATION_CACHE_DIR=str(pytestconfig.cache.mkdir("jax")),
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return types.MappingProxyType(env)
