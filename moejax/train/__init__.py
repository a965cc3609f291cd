"""Training the embedded small MoE on real text (`python -m moejax.train
--config=configs/train_small.py`): the corpus and its held-out split (`corpus.py`), the
trainable model with its balance losses (`model.py`), and the loop that exports a checkpoint
(`loop.py`)."""

from moejax.train import corpus
from moejax.train.loop import train

__all__ = ["corpus", "train"]
