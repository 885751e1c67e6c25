"""One prefill op at one shape, ready to time (`Case`), and what the ops share: ragged rows from
position 0, a state pool of read and write slots, the errors of our op and of its anchor."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness.timing import rel_err
from pallas_kernels.rows import Rows

BF, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32
CALLS = 8  # SSD and GDN calls per timed loop, each reading its own copy of the inputs

Inputs = list[tuple[jax.Array, ...]]  # input sets; call i of a timed loop reads set i % len
# A timed call: (i, state, inputs) -> (y, state)
Step = Callable[[int, jax.Array, Inputs], tuple[jax.Array, jax.Array]]
Call = Callable[[jax.Array], tuple[jax.Array, jax.Array]]  # one call: state -> (y, state)


@dataclasses.dataclass(frozen=True)
class Case:
    """One op at one shape, ready to run: `make_step(config)` builds a step over `state` and
    `inputs` (`input_sets`); `check(call)` is the error of one call against the reference;
    `nbytes` must move per call; `inner` calls per timed loop on the GPU (one with `--quick`);
    `anchor(anchors)` times the anchor and returns its record fields."""

    op: str
    make_step: Callable[[dict], Step]
    state: jax.Array
    inputs: Inputs
    check: Callable[[Call], dict]
    nbytes: float
    inner: int
    anchor: Callable[[Any], dict]


def rows_meta(batch: int, seqlen: int, hi: bool = True) -> Rows:
    """`batch` rows of `seqlen` tokens from position 0 (has_initial_state `hi`), read slots
    1..R, write slots R+1..2R."""
    qsl = jnp.arange(batch + 1, dtype=I32) * seqlen
    rd = jnp.arange(1, batch + 1, dtype=I32)
    return Rows(qsl, jnp.zeros((batch,), I32), jnp.full((batch,), hi), rd, rd + batch)


def slot_pool(init: np.ndarray) -> jax.Array:
    """fp32 state pool [2R + 1, ...]: the initial states in slots 1..R, zeros elsewhere."""
    batch = init.shape[0]
    return jnp.zeros((2 * batch + 1,) + init.shape[1:], F32).at[1 : batch + 1].set(init)


def written_states(pool: np.ndarray | jax.Array) -> np.ndarray | jax.Array:
    """The final states in slots R+1..2R of a `slot_pool` (R = pool rows // 2)."""
    return pool[pool.shape[0] // 2 + 1 :]


def anchor_fields(name: str, us: float, y, states, ref: Callable[[], tuple]) -> dict:
    """An anchor's record fields: its time, and the errors of its output `y` and final `states`
    (torch tensors) against our reference's output and the states it wrote."""
    y_ref, pool_ref = ref()
    return dict(
        anchor=name,
        anchor_us=us,
        anchor_err_y=rel_err(y.float().cpu().numpy().reshape(y_ref.shape), y_ref),
        anchor_err_state=rel_err(states.float().cpu().numpy(), written_states(pool_ref)),
    )


def pool_check(pool: jax.Array, ref: Callable[[], tuple]) -> Callable[[Call], dict]:
    """`Case.check` for an op writing final states into a `slot_pool`: errors of y and of them."""

    def check(call: Call) -> dict:
        (y, p), (y_ref, p_ref) = call(jnp.copy(pool)), ref()
        return dict(
            err_y=rel_err(y, y_ref), err_state=rel_err(written_states(p), written_states(p_ref))
        )

    return check
