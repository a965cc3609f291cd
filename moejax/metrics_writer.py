"""One writer for scalar metrics: TensorBoard event files (tensorboardX, no TensorFlow needed)
under the workdir, slash-namespaced names with units (`loss/bits_per_byte`;
`perf/virtual/ttft_s`: a time names the clock that made it)."""

from __future__ import annotations

import os


class MetricsWriter:
    def __init__(self, workdir: str, subdir: str = "tensorboard"):
        from tensorboardX import SummaryWriter

        self.logdir = os.path.join(workdir, subdir)
        self._writer = SummaryWriter(self.logdir)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            if value is not None:
                self._writer.add_scalar(name, float(value), step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
