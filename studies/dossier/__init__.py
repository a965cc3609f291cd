"""The disk tier's questions (the dossier): storage → host → device. README.md: the question,
the commands, the findings."""
