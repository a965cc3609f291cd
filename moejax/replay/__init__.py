"""Trace replay: recorded routing through the expert cache, no model.

Two engines, one semantics. The reference (`engine.py`) feeds each recorded pass's gates
(`gates.py`) to the very `ExpertCache` and policy objects the live runtime uses; the compiled
engine (`compiled.py`, its numba kernel `kernel.py`) runs the configurations it declares
(`coverage.py`) and nothing else: whatever it does not declare runs on the reference. Policies
that read the future (Belady, the oracles) get it from `future.py`.
"""

from moejax.replay.coverage import ENGINES, Decision
from moejax.replay.engine import replay
from moejax.replay.future import Future, future_of, future_of_requests
from moejax.replay.gates import layer_gates

__all__ = ["ENGINES", "Decision", "Future", "future_of", "future_of_requests", "layer_gates", "replay"]
