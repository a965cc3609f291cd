"""studies/: one folder per study, each with a README giving the question, the commands and the
findings; every command a README names runs a module that exists, every link it makes lands on
a file, and SpecMD's README gives the command its claims table was produced by."""

from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDIES = os.path.join(ROOT, "studies")
NAMES = sorted(d for d in os.listdir(STUDIES)
               if os.path.isdir(os.path.join(STUDIES, d)) and not d.startswith(("_", ".")))


def _readme(study: str) -> str:
    return open(os.path.join(STUDIES, study, "README.md"), encoding="utf-8").read()


def test_the_studies():
    assert NAMES == ["dossier", "fiddler", "specmd"]
    index = open(os.path.join(STUDIES, "README.md"), encoding="utf-8").read()
    assert all(f"]({name}/README.md)" in index for name in NAMES)


@pytest.mark.parametrize("study", NAMES)
def test_each_readme_gives_the_question_the_commands_and_the_findings(study):
    text = _readme(study)
    assert os.path.isfile(os.path.join(STUDIES, study, "__init__.py"))
    for heading in ("## The question", "## Commands", "## Findings"):
        assert f"\n{heading}\n" in text, heading
    assert "](findings.md)" in text
    # Every module a command runs exists; every relative link lands on a file.
    for module in re.findall(r"python -m ((?:studies|moejax|launch)(?:\.\w+)+)", text):
        path = os.path.join(ROOT, *module.split("."))
        assert os.path.isfile(path + ".py") or os.path.isfile(
            os.path.join(path, "__main__.py")), module
    for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert os.path.exists(os.path.join(STUDIES, study, link)), link
    for script in re.findall(r"python (benchmarks/\w+\.py)", text):
        assert os.path.isfile(os.path.join(ROOT, script)), script


def test_specmd_readme_gives_the_command_of_its_claims_table():
    table = open(os.path.join(STUDIES, "specmd", "claims_table.md"), encoding="utf-8").read()
    [command] = re.findall(r"^Produced by: `(.*)`$", table, re.M)
    assert command.startswith("python -m studies.specmd.claims ")
    readme = _readme("specmd").replace("\\\n    ", "")
    assert command in readme
    sweeps = re.findall(r"--sweep_dir=(\S+)", command)
    for sweep in sweeps:  # each sweep of the table is one the README's commands make
        assert re.search(rf"python -m launch.sweep --config=\S+ --sweep_dir={sweep} ", readme)
