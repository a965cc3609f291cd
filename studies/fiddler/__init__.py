"""Host compute and Fiddler's claims: the claims, their bands and baselines, and the command
(`claims`: `python -m studies.fiddler.claims --sweep_dir=D`). README.md: the question, the
commands, the findings."""
