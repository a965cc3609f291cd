"""Routing traces: the gate outputs of every pass and MoE layer of a run (`format.py`, one
numpy-only `.npz`), imported from capture JSONL and vLLM routing logs (`importers.py`), cut into
requests with prefills (`requests.py`), recorded live (`recorder.py`, which reads the model's
gate outputs and so loads JAX: import it from its module), and driving a live run's routing
(`driven.py`: `policies.routing='trace(path=T)'`, imported from its module too). The face is
numpy only."""

from moejax.traces.format import FORMAT, Trace, TraceError, load
from moejax.traces.importers import ImportedTraces, ImportNotes, import_traces, load_traces
from moejax.traces.requests import as_requests

__all__ = ["FORMAT", "ImportNotes", "ImportedTraces", "Trace", "TraceError",
           "as_requests", "import_traces", "load", "load_traces"]
