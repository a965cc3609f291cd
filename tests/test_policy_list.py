"""`python -m moejax.policies --list` (`moejax/policies/__main__.py`): one line per registered
policy, every one of them, and README's policy list is its output verbatim."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from moejax.policies import KINDS, names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = re.compile(r"^(eviction|prefetch|miss|routing) ([a-z_0-9]+)(\(| |$)")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "moejax.policies", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, encoding="utf-8", timeout=120)


@pytest.fixture(scope="module")
def listed() -> str:
    done = _run("--list")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def test_readme_holds_the_list_verbatim(listed):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    # The whole fenced block, so a line the registry no longer has (or a new one) is a
    # difference too, not only a line changed.
    assert f"```text\n{listed}```\n" in readme, (
        "README's policy list differs from `python -m moejax.policies --list`; paste its output")


def test_every_registered_policy_once(listed):
    lines = listed.splitlines()
    assert lines and listed.endswith("\n")
    for line in lines:
        assert LINE.match(line), line
    found = [LINE.match(line).group(1, 2) for line in lines]
    registered = [(kind, name) for kind in KINDS for name in names(kind)]
    assert sorted(found) == sorted(registered)
    assert len(set(found)) == len(found)


def test_names_the_issue_found_missing_and_shows_defaults(listed):
    """Written by hand, not from the registry: the policies README's hand-kept list lacked, and
    the spec arguments with their defaults as the constructors declare them."""
    lines = listed.splitlines()
    for kind, name in [("eviction", "priority"), ("eviction", "belady"),
                       ("prefetch", "temporal"), ("prefetch", "oracle"),
                       ("prefetch", "noisy_oracle"), ("miss", "host_compute"),
                       ("miss", "latency_aware"), ("routing", "trace")]:
        assert sum(re.match(rf"{kind} {name}\b(?!_)", line) is not None for line in lines) == 1
    assert "prefetch score_percentile(p=80.0, lookahead=1) -- " in listed
    assert "routing cache_aware(lam=0.3) -- " in listed
    assert "eviction belady [replay only] -- Belady's MIN" in listed
    assert "eviction lru -- " in listed
    kinds = [line.split(" ", 1)[0] for line in lines]
    assert kinds == sorted(kinds, key=["eviction", "prefetch", "miss", "routing"].index)


def test_no_arguments_is_the_list_and_help_and_bad_flag(listed):
    assert _run().stdout == listed
    shown = _run("--help")
    assert shown.returncode == 0 and "--list" in shown.stdout
    bad = _run("--lsit")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "python -m moejax.policies: error: unrecognized arguments: --lsit (--help lists the flags)"]
