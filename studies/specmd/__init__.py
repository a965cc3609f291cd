"""SpecMD's claims against moejax: the paper's numbers and claims as data (`paper`), the rules
that read them (`rules`), the cells `--traces` runs (`cells`) and the command (`claims`:
`python -m studies.specmd.claims`). README.md: the question, the commands, the findings."""
