"""Routing traces: the gate outputs of every pass and MoE layer of a run (`format.py`, one
numpy-only `.npz`), recorded live (`recorder.py`), imported from capture JSONL and vLLM routing
logs (`importers.py`), and cut into requests with prefills (`requests.py`)."""

from moejax.traces.format import FORMAT, Trace, TraceError, load
from moejax.traces.importers import ImportedTraces, ImportNotes, import_traces, load_traces
from moejax.traces.recorder import TraceRecorder
from moejax.traces.requests import as_requests

__all__ = ["FORMAT", "ImportNotes", "ImportedTraces", "Trace", "TraceError", "TraceRecorder",
           "as_requests", "import_traces", "load", "load_traces"]
