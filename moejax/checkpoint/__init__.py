"""moejax checkpoints: the directory `python -m moejax.convert` writes from a Hugging Face
checkpoint (TensorStore experts, Orbax dense parameters, config.json; DESIGN.md "Checkpoint
layout"), and what reads it. These names are the API; the modules behind them are not.

Writing: `save`, `save_model`, `copy_in_layout`, `add_precisions`. Reading: `load` (a `Checkpoint`),
`read_config`, `read_precisions`, `expert_layout`, `read_expert_index`,
`read_native_experts`, `read_quantized_experts`; `to_host` / `host_memory_kind` place arrays in
host memory. A missing, corrupt or inconsistent file is a `CheckpointError` naming it.
"""

from moejax.checkpoint.meta import (
    ADD_PRECISIONS_HINT,
    LAYOUTS,
    expert_layout,
    read_config,
    read_expert_index,
    read_precisions,
)
from moejax.checkpoint.options import (
    check_expert_layout,
    check_group_size,
    parse_precisions,
    resolve_calibrations,
)
from moejax.checkpoint.reader import (
    Checkpoint,
    host_memory_kind,
    load,
    read_native_experts,
    read_quantized_experts,
    to_host,
)
from moejax.checkpoint.writer import (
    TOKENIZER_FILES,
    add_precisions,
    copy_in_layout,
    save,
    save_model,
)
from moejax.errors import CheckpointError

__all__ = [
    "ADD_PRECISIONS_HINT", "LAYOUTS", "TOKENIZER_FILES", "Checkpoint", "CheckpointError",
    "add_precisions", "check_expert_layout", "copy_in_layout", "check_group_size", "expert_layout",
    "host_memory_kind", "load", "parse_precisions", "read_config", "read_expert_index",
    "read_native_experts", "read_precisions", "read_quantized_experts", "resolve_calibrations",
    "save", "save_model", "to_host",
]
