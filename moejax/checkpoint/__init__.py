"""moejax checkpoints: the directory `python -m moejax.convert` writes from a Hugging Face
checkpoint (TensorStore experts, Orbax dense parameters, config.json; DESIGN.md "Checkpoint
layout"), and what reads it. These names are the API; the modules behind them are not.

Writing: `save`, `save_model`, `copy_in_layout`, `add_precisions`. Reading: `load` (a `Checkpoint`),
`read_config`, `read_precisions`, `expert_layout`, `read_expert_index`,
`read_native_experts`, `read_quantized_experts`; `to_host` / `host_memory_kind` place arrays in
host memory. A missing, corrupt or inconsistent file is a `CheckpointError` naming it. The
live disk tier reads experts one by one with an `ExpertReader` (`io.*`: `check_io`, `IO_MODES`)
into page-aligned buffers (`PAGE`, `page_aligned`); conversion reads a Hugging Face directory
(`SafetensorsDir`, `dense_sources`, `read_layer_experts`, `is_hugging_face_dir`) and the
dense parameters flat (`flat_params`).
"""

from moejax.checkpoint.expert_reader import IO_MODES, ExpertReader, check_io
from moejax.checkpoint.expert_store import quantized_shapes
from moejax.checkpoint.hf_names import dense_sources, read_layer_experts
from moejax.checkpoint.meta import (
    ADD_PRECISIONS_HINT,
    LAYOUTS,
    expert_layout,
    hugging_face_message,
    is_hugging_face_dir,
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
from moejax.checkpoint.params import flat_params
from moejax.checkpoint.read_buffers import PAGE, page_aligned
from moejax.checkpoint.reader import (
    Checkpoint,
    host_memory_kind,
    load,
    read_native_experts,
    read_quantized_experts,
    to_host,
)
from moejax.checkpoint.safetensors_dir import SafetensorsDir
from moejax.checkpoint.writer import (
    TOKENIZER_FILES,
    add_precisions,
    copy_in_layout,
    save,
    save_model,
)
from moejax.errors import CheckpointError

__all__ = [
    "ADD_PRECISIONS_HINT", "IO_MODES", "LAYOUTS", "PAGE", "TOKENIZER_FILES", "Checkpoint",
    "CheckpointError", "ExpertReader", "SafetensorsDir", "add_precisions", "check_expert_layout",
    "check_group_size", "check_io", "copy_in_layout", "dense_sources", "expert_layout",
    "flat_params", "host_memory_kind", "hugging_face_message", "is_hugging_face_dir", "load",
    "page_aligned", "parse_precisions", "quantized_shapes", "read_config", "read_expert_index",
    "read_layer_experts", "read_native_experts", "read_precisions", "read_quantized_experts",
    "resolve_calibrations", "save", "save_model", "to_host",
]
