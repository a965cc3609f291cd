"""Small building blocks shared by every family: norms, activations, dtype lookup."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.model_config import ModelConfig


def jnp_dtype(name: str) -> jnp.dtype:
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}[name]


def activation(name: str):
    return {
        "silu": jax.nn.silu,
        "relu": jax.nn.relu,
        "gelu": lambda x: jax.nn.gelu(x, approximate=False),
        "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    }[name]


def norm(x: jax.Array, kind: str, eps: float, scale: jax.Array,
         bias: jax.Array | None = None) -> jax.Array:
    """RMSNorm (`kind="rms"`) or LayerNorm, computed in float32 like the references."""
    dtype = x.dtype
    x = x.astype(jnp.float32)
    if kind == "rms":
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
        return scale * x.astype(dtype)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    x = (x - mean) * jax.lax.rsqrt(var + eps)
    return (x * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(dtype)


class Norm(nnx.Module):
    """RMSNorm (no bias) or LayerNorm (with bias)."""

    def __init__(self, dim: int, kind: str, eps: float, dtype: jnp.dtype):
        self.kind = kind
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), dtype))
        if kind == "layer":
            self.bias = nnx.Param(jnp.zeros((dim,), dtype))

    def bias_or_zeros(self) -> jax.Array:
        return self.bias[...] if self.kind == "layer" else jnp.zeros_like(self.scale[...])

    def __call__(self, x: jax.Array) -> jax.Array:
        return norm(x, self.kind, self.eps, self.scale[...], self.bias_or_zeros())


def linear(din: int, dout: int, bias: bool, cfg: ModelConfig, rngs: nnx.Rngs) -> nnx.Linear:
    dtype = jnp_dtype(cfg.dtype)
    return nnx.Linear(din, dout, use_bias=bias, dtype=dtype, param_dtype=dtype,
                      kernel_init=nnx.initializers.normal(0.02), rngs=rngs)


class MLP(nnx.Module):
    """Gated MLP `down(act(gate(x)) * up(x))`: Qwen's dense layers and its shared expert."""

    def __init__(self, cfg: ModelConfig, intermediate: int, rngs: nnx.Rngs):
        self.gate = linear(cfg.hidden_size, intermediate, False, cfg, rngs)
        self.up = linear(cfg.hidden_size, intermediate, False, cfg, rngs)
        self.down = linear(intermediate, cfg.hidden_size, False, cfg, rngs)
        self.act = activation(cfg.hidden_act)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(self.act(self.gate(x)) * self.up(x))
