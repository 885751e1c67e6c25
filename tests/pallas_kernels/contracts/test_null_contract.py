"""The NULL-slot contract, one test for every stateful op (architecture.md 5, invariant 3).

Slot 0 of the state pool is poisoned with NaN. Then, for the kernel (interpret) and the reference:
(a) live outputs equal those of an unpoisoned run, (b) every non-zero slot equals the unpoisoned
run bit for bit, (c) slot 0 is bit-identical to its poisoned input, (d) padding outputs are finite
zeros.

Register a case per op in CASES: a function returning a `Case` built from small numpy inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import numpy as np
import pytest

from pallas_kernels import ops
from pallas_kernels.conv import prefill as conv_kernels
from tests.pallas_kernels.conv import test_causal_conv1d as conv
from tests.pallas_kernels.gdn import test_gdn_chunk as gdnc
from tests.pallas_kernels.gdn import test_gdn_decode as gdnd
from tests.pallas_kernels.gdn import test_gdn_state_update as gdnu
from tests.pallas_kernels.ssd import test_mamba2_decode as m2d
from tests.pallas_kernels.ssd import test_ssd_chunk_scan as scan
from tests.pallas_kernels.ssd import test_ssd_state_update as ssu

# Dispatched ops that hold no recurrent state pool (paged attention's NaN NULL block is checked in
# test_paged_decode_attention.py).
NOT_STATEFUL = {
    "dispatched",
    "Rows",  # the prefill ops' argument type, not an op
    "paged_attention",
    "paged_decode_attention",
    "ragged_attention",
    "attention",
    "write_kv",
    "grouped_matmul",  # no state pool: MoE experts (tests in test_grouped_matmul.py)
    "fp8_grouped_matmul",  # no state pool: FP8 experts (tests in test_fp8_grouped_matmul.py)
    "matmul",  # no state pool: the batch-invariant projections (tests in test_matmul.py)
    "fp8_weight_matmul",  # no state pool: FP8 weights (tests in test_fp8_weights.py)
    "row_sum_squares",  # no state pool: the norms' statistics (test_row_sum_squares.py)
}


@dataclasses.dataclass(frozen=True)
class Case:
    """run(pool, implementation) -> (output, new_pool); padding: outputs that must be 0 (bool)."""

    run: Callable[[np.ndarray, str], tuple[jax.Array, jax.Array]]
    pool: np.ndarray
    padding: np.ndarray


CASES: dict[str, Callable[[], Case]] = {}


def case(name: str):
    def register(build: Callable[[], Case]) -> Callable[[], Case]:
        CASES[name] = build
        return build

    return register


def _with_pool(d: dict, key: str, names: tuple[str, ...], op, **kw):
    def run(pool, implementation):
        args = [pool if n == key else d[n] for n in names]
        return op(*args, **kw, implementation=implementation)

    return run


def _varlen_padding(qsl: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    pad = np.zeros(shape, bool)
    pad[qsl[-1] :] = True
    return pad


def _conv_prefill_case(op) -> Case:
    d = conv.prefill_inputs(3, (5, 1, 4), 6, 4)
    d["has_initial_state"][:] = True
    d["read_slots"][1] = 0  # has_initial_state with a NULL read slot: must read zeros

    def run(pool, implementation):
        return op(*conv.prefill_args({**d, "conv_state": pool}), implementation=implementation)

    return Case(run, d["conv_state"], _varlen_padding(d["query_start_loc"], d["x"].shape))


@case("causal_conv1d_prefill")
def _conv_prefill() -> Case:
    return _conv_prefill_case(ops.causal_conv1d_prefill)


@case("causal_conv1d_prefill (walk kernel)")
def _conv_prefill_walk() -> Case:
    """The walk kernel in segments short enough (4 tokens) to cut the 5-token row, which the
    dispatched default (128-token segments) never does at this size."""

    def op(*args, implementation):
        if implementation == "reference":
            return ops.causal_conv1d_prefill(*args, implementation=implementation)
        return conv_kernels.causal_conv1d_prefill(
            *args, interpret=True, walk_tokens=4, unroll=2, block_d=4
        )

    return _conv_prefill_case(op)


@case("causal_conv1d_update")
def _conv_update() -> Case:
    d = conv.update_inputs(4, 3, 2, 6, 4)
    run = _with_pool(d, "conv_state", conv.UPDATE, ops.causal_conv1d_update)
    pad = np.broadcast_to((d["write_slots"] <= 0)[:, :, None], d["x"].shape)
    return Case(run, d["conv_state"], pad)


@case("causal_conv1d_boundary_states")
def _conv_boundary_states() -> Case:
    """A pool-only op (no token outputs): rows read initial windows, one through a NULL read
    slot, and write boundary windows, one column of each row NULL."""
    d = conv.prefill_inputs(7, (21, 9, 17), 6, 4, slots=24)
    d["has_initial_state"][:] = True
    d["read_slots"][1] = 0
    nc = np.array([16, 6, 0, 0], np.int32)
    boundary = np.array([[13, 0, 15], [16, 0, 17], [18, 19, 0], [0, 0, 0]], np.int32)
    rows = conv.rows_of({**d, "num_computed": nc}, boundary, 8)

    def run(pool, implementation):
        new_pool = ops.causal_conv1d_boundary_states(
            d["x"], pool, rows, implementation=implementation
        )
        return np.zeros(1, np.float32), new_pool

    return Case(run, d["conv_state"], np.zeros(1, bool))


@case("ssd_chunk_scan")
def _ssd_chunk_scan() -> Case:
    d = scan.make_inputs(5, (6, 1, 9), slots=14)
    d["has_initial_state"][:] = True
    d["read_slots"][1] = 0
    free = sorted(set(range(1, 14)) - set(d["read_slots"]) - set(d["write_slots"]))
    nb = np.array([[free[0], 0], [0, 0], [free[1], 0], [0, 0]], np.int32)

    def run(pool, implementation):
        kw = dict(chunk_size=16, block_size=16, boundary_slots=nb)
        return scan.run({**d, "ssm_state": pool}, implementation, **kw)

    return Case(run, d["ssm_state"], _varlen_padding(d["query_start_loc"], d["x"].shape))


@case("ssd_state_update")
def _ssd_state_update() -> Case:
    d = ssu.make_inputs(6, 3, 2)
    opts = {k: d[k] for k in ssu.OPTS}
    run = _with_pool(d, "ssm_state", ssu.ARGS, ops.ssd_state_update, **opts)
    pad = np.broadcast_to((d["write_slots"] <= 0)[:, :, None, None], d["x"].shape)
    return Case(run, d["ssm_state"], pad)


def _fused_decode_case(module, pools: tuple[str, str], pool_name: str) -> Case:
    """The fused decode ops hold two pools: each case poisons one, the other starts with slot 0
    zero."""
    d = module.make_inputs(6, 4, 2)
    for name in pools:
        d[name][0] = 0.0
    index = 1 + pools.index(pool_name)

    def run(pool, implementation):
        out = module.run({**d, pool_name: pool}, implementation)
        return out[0], out[index]

    out_shape = jax.eval_shape(lambda: module.run(d, "reference")[0]).shape
    pad = np.broadcast_to((d["write_slots"] <= 0)[:, :, None, None], out_shape)
    return Case(run, d[pool_name], pad)


def _mamba2_decode_case(pool_name: str) -> Case:
    return _fused_decode_case(m2d, ("conv_state", "ssm_state"), pool_name)


def _gdn_decode_case(pool_name: str) -> Case:
    return _fused_decode_case(gdnd, ("conv_state", "state"), pool_name)


@case("gdn_decode")
def _gdn_decode() -> Case:
    return _gdn_decode_case("state")


@case("gdn_decode (conv pool)")
def _gdn_decode_conv_pool() -> Case:
    return _gdn_decode_case("conv_state")


@case("mamba2_decode")
def _mamba2_decode() -> Case:
    return _mamba2_decode_case("ssm_state")


@case("mamba2_decode (conv pool)")
def _mamba2_decode_conv_pool() -> Case:
    return _mamba2_decode_case("conv_state")


@case("gdn_chunk")
def _gdn_chunk() -> Case:
    args, kw = gdnc.make_case([5, 1, 20], [0, 3, 9], [True, True, True], T=30, nb=1, bs=16)
    args[9][1] = 0  # has_initial_state with a NULL read slot: must read zeros
    pool = args[5]
    pool[0] = 0.0

    def run(p, implementation):
        a = list(args)
        a[5] = p
        return ops.gdn_chunk(*gdnc.as_rows(a, **kw), chunk_size=16, implementation=implementation)

    return Case(run, pool, _varlen_padding(args[6], args[2].shape))


@case("gdn_state_update")
def _gdn_state_update() -> Case:
    args = gdnu.make_case(3, 2, pad_rows=(0,), dead=((1, 1),))
    pool = args[7]
    pool[0] = 0.0

    def run(p, implementation):
        a = list(args)
        a[7] = p
        return ops.gdn_state_update(*a, implementation=implementation)

    pad = np.broadcast_to((args[9] <= 0)[:, :, None, None], args[2].shape)
    return Case(run, pool, pad)


def _bytes(a) -> bytes:
    return np.ascontiguousarray(np.asarray(a)).tobytes()


@pytest.mark.parametrize("implementation", ["interpret", "reference"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_null_slot_contract(name: str, implementation: str):
    c = CASES[name]()
    poisoned = c.pool.copy()
    poisoned[0] = np.nan
    clean_out, clean_pool = (np.asarray(a) for a in c.run(c.pool.copy(), implementation))
    out, pool = (np.asarray(a) for a in c.run(poisoned, implementation))
    live = ~c.padding
    np.testing.assert_array_equal(out[live], clean_out[live])  # (a)
    assert _bytes(pool[1:]) == _bytes(clean_pool[1:]), "a non-NULL slot depends on slot 0"  # (b)
    assert _bytes(pool[0]) == _bytes(poisoned[0]), "slot 0 was written"  # (c)
    for o in (out, clean_out):  # (d)
        assert np.all(np.isfinite(o)) and not np.any(o[c.padding]), "padding output is not 0"
    assert np.all(np.isfinite(pool[1:]))


def test_every_stateful_op_has_a_case():
    exported = {
        n for n in dir(ops) if not n.startswith("_") and callable(getattr(ops, n))
    } - NOT_STATEFUL
    assert exported <= set(CASES), f"ops without a NULL-contract case: {exported - set(CASES)}"
