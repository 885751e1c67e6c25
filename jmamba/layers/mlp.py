"""Dense feed-forward blocks: SwiGLU (gate, up, down), NemotronH's relu^2 (up, down), and a
gated MLP with gate and up in one kernel (Zamba2's shared block, whose LoRA adapter spans both)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jmamba.layers.linear import Linear
from jmamba.parallel.rules import Segment, ShardRule, split


def relu2(x: jax.Array) -> jax.Array:
    return jnp.square(jax.nn.relu(x))


class MLP(nnx.Module):
    """`down(silu(gate(x)) * up(x))` for `silu_gated`, `down(relu(up(x))^2)` for `relu2`."""

    def __init__(self, hidden: int, intermediate: int, activation: str, *, rngs: nnx.Rngs):
        self.gated = activation == "silu_gated"
        if self.gated:
            self.gate_proj = Linear(hidden, intermediate, rngs=rngs)
        self.up_proj = Linear(hidden, intermediate, rngs=rngs)
        self.down_proj = Linear(intermediate, hidden, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.gated:
            return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(relu2(self.up_proj(x)))


_GATE_ACTIVATIONS = {"gelu": lambda x: jax.nn.gelu(x, approximate=False), "silu": jax.nn.silu}


class GateUpMLP(nnx.Module):
    """`down(act(g) * u)` with `[g | u] = x gate_up`: gate_up [hidden, 2 x intermediate] (the gate's
    columns first), down [intermediate, hidden]; `activation` "gelu" (exact, erf) or "silu"."""

    def __init__(self, hidden: int, intermediate: int, activation: str, *, rngs: nnx.Rngs):
        self.activation = activation
        self.gate_up_proj = Linear(hidden, 2 * intermediate, rngs=rngs)
        self.down_proj = Linear(intermediate, hidden, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        gate, up = jnp.split(self.gate_up_proj(x), 2, axis=-1)
        return self.down_proj(_GATE_ACTIVATIONS[self.activation](gate) * up)


def mlp_tp_rules(field: str, intermediate: int, gated: bool) -> dict[tuple[str, ...], ShardRule]:
    """Column-parallel gate and up (their `intermediate` channels over tp), row-parallel down;
    `field` names the config field of `intermediate` in errors."""
    channels = Segment(field, intermediate)
    rules: dict[tuple[str, ...], ShardRule] = {
        ("up_proj", "kernel"): split(1, channels),
        ("down_proj", "kernel"): split(0, channels),
    }
    if gated:
        rules[("gate_proj", "kernel")] = split(1, channels)
    return rules
