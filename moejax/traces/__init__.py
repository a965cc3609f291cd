"""Routing traces: the gate outputs of every pass and MoE layer of a run (`format.py`, one
numpy-only `.npz`), imported from capture JSONL and vLLM routing logs (`importers.py`), cut into
requests with prefills (`requests.py`), drawn at random for tests and demos (`synthetic.py`), parsed once per process for many runs of the same file
(`memo.py`: `import_traces_memo`, kept by the file's content hash), recorded live (`recorder.py`), and driving a live run's
routing (`driven.py`: `policies.routing='trace(path=T)'`, imported as `moejax.traces.driven`:
it builds the routing policies). The face is numpy only; code outside the package imports
through it."""

from moejax.traces.format import FORMAT, Trace, TraceError, load
from moejax.traces.importers import ImportedTraces, ImportNotes, import_traces, load_traces
from moejax.traces.memo import import_traces_memo
from moejax.traces.recorder import TraceRecorder
from moejax.traces.requests import as_requests
from moejax.traces.synthetic import random_scored_trace

__all__ = ["FORMAT", "ImportNotes", "ImportedTraces", "Trace", "TraceError", "TraceRecorder",
           "as_requests", "import_traces", "import_traces_memo", "load", "load_traces",
           "random_scored_trace"]
