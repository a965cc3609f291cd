"""`python -m moejax.train --config=configs/train_small.py --workdir=DIR`: the same door as
`python -m moejax.main` (the training config says `job = "train"`)."""

from absl import app

from moejax.main import main

if __name__ == "__main__":
    app.run(main)
