"""`python -m moejax.train --config=configs/train_small.py --workdir=DIR`: the same door as
`python -m moejax.main` (the training config says `job = "train"`), with its one error path: a
mistake in what was typed is one line and exit status 2 (`moejax.main.start`)."""

from moejax.main import start

if __name__ == "__main__":
    start("moejax.train")
