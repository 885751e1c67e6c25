"""Rotary position embedding (rotate-half form), applied to the first `rotary_dim` dims only."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def apply_rope(x: jax.Array, positions: jax.Array, rotary_dim: int, theta: float) -> jax.Array:
    """Rotate `x[..., :rotary_dim]` by the angle `position * theta^(-2i / rotary_dim)`.

    Args:
      x: [..., num_heads, head_dim] queries or keys.
      positions: [...] int32 absolute positions, broadcast over heads.
    """
    if rotary_dim == 0:
        return x
    inv_freq = 1.0 / theta ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim)
    freqs = positions.astype(jnp.float32)[..., None, None] * inv_freq  # [..., 1, rotary_dim / 2]
    cos = jnp.concatenate([jnp.cos(freqs)] * 2, axis=-1)
    sin = jnp.concatenate([jnp.sin(freqs)] * 2, axis=-1)
    rot, rest = x[..., :rotary_dim].astype(jnp.float32), x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated_half = jnp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    rotated = (rot * cos + rotated_half * sin).astype(x.dtype)
    return jnp.concatenate([rotated, rest], axis=-1)
