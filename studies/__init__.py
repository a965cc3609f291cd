"""Studies: one folder per question moejax was used to answer, each with its README (the
question, the commands, the findings), its data (a paper's numbers and claims) and the code
that is only its own. The library (`moejax`) never imports a study; a study imports the
library.

* `studies/specmd/` — SpecMD's claims judged trace by trace (`python -m studies.specmd.claims`);
* `studies/fiddler/` — host compute and Fiddler's claims (`python -m studies.fiddler.claims`);
* `studies/dossier/` — the disk tier's questions.

Run from the repository root: `studies` is not installed with the package (pyproject's
`[tool.setuptools.packages.find]` includes `moejax*` and `launch*` only).
"""
