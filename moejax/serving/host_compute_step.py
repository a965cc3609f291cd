"""The live runtime's host compute: a wave's host experts computed from the host's copy.

On the CPU backend the device is the host: the `pinned_host` tables' own bytes are viewed as
device arrays (no copy, no slot), and the experts step's own function computes the host's
contributions, bit for bit the device's, before the device's waves of the layer.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from moejax.quant import QuantizedWeights
from moejax.seam import ExpertWave, Wave


class HostComputeSteps:
    """The host compute part of `CachedExperts` (`runtime.py`): a wave's host experts as a
    step over the layer's host tables. It uses the runtime's slot pools (`pool`, whose host
    tables it views) and `_upload`."""

    def _init_host_compute(self) -> None:
        self._identity = None
        self._host_views: dict[int, tuple] = {}

    def _host_wave(self, wave: Wave, ids) -> ExpertWave:
        """The step computing `wave.host_experts` from the host's copy, before the device's
        waves: a wave over the layer's host tables at the plain precision (every expert, so
        the identity slot map) with the host's contributions only (`host_active`), its
        outputs joining the device waves' as a wave's partial outputs do."""
        gate_up, down = self._host_tables(wave.layer)
        if self._identity is None:
            self._identity = self._upload(np.arange(self.num_experts, dtype=np.int32))
        weights = np.where(wave.host_active, wave.weights, 0.0).astype(np.float32)
        return ExpertWave(gate_up, down, self._identity, ids, self._upload(weights), False)

    def _host_tables(self, layer: int) -> tuple:
        """The host's copy of `layer`'s experts as a step reads them. On the CPU backend the
        device is the host: the `pinned_host` tables' own bytes, viewed as device arrays (no
        copy, no slot), so the host computes the experts where their weights are, with the
        experts step's own function (bit for bit the device's). On an accelerator the step
        would have to run under `compute_on("device_host")`, whose memory-space typing (JAX
        0.10) refuses the grouped matmul's gathers: `_check_host_compute` refuses it there."""
        tables = self._host_views.get(layer)
        if tables is None:
            pool = self.pool.pools[0]  # the plain precision's (host compute: no disk tier)
            on_device = jax.sharding.SingleDeviceSharding(jax.devices()[0],
                                                          memory_kind="device")
            view = functools.partial(_alias, sharding=on_device)
            gate_up = jax.tree.map(view, pool.host_gate_up[layer])
            down = jax.tree.map(view, pool.host_down[layer])
            if isinstance(gate_up, QuantizedWeights):  # as the step reads a packed pool
                gate_up, down = (gate_up,), (down,)
            tables = self._host_views[layer] = (gate_up, down)
        return tables


def _alias(host_array: jax.Array, sharding) -> jax.Array:
    """A CPU-backend `pinned_host` array as a device array over the same bytes (numpy's view
    of it, put on the device without a copy: checked)."""
    view = jax.device_put(np.asarray(host_array), sharding)
    if view.unsafe_buffer_pointer() != host_array.unsafe_buffer_pointer():
        raise AssertionError("the host table's device view is a copy, not its bytes")
    return view
