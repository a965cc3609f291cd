"""Training the embedded small MoE: `python -m moejax.train --config=configs/train_small.py`."""
