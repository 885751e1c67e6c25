"""causal_conv1d prefill/update: reference and kernel (interpret) against a naive numpy loop."""

from __future__ import annotations

import numpy as np
import pytest

from pallas_kernels import ops
from pallas_kernels.conv import prefill as conv_mod
from pallas_kernels.rows import Rows


def _act(v: np.ndarray, activation: str | None) -> np.ndarray:
    return v / (1.0 + np.exp(-v)) if activation == "silu" else v


def oracle_prefill(x, w, bias, pool, qsl, has_init, read, write, activation):
    """Row by row, token by token, in float64."""
    src = pool.astype(np.float64)
    y, pool = np.zeros(x.shape, np.float64), src.copy()
    width = w.shape[1]
    for r in range(len(qsl) - 1):
        init = src[read[r]] if (has_init[r] and read[r] > 0) else np.zeros(pool.shape[1:])
        xx = np.concatenate([init, x[qsl[r] : qsl[r + 1]].T.astype(np.float64)], axis=1)
        for i in range(qsl[r + 1] - qsl[r]):
            acc = (xx[:, i : i + width] * w).sum(1) + (0 if bias is None else bias)
            y[qsl[r] + i] = _act(acc, activation)
        if write[r] > 0:
            pool[write[r]] = xx[:, xx.shape[1] - (width - 1) :]
    return y, pool


def oracle_update(x, w, bias, pool, read, write, activation):
    src = pool.astype(np.float64)
    y, pool = np.zeros(x.shape, np.float64), src.copy()
    for b in range(x.shape[0]):
        win = src[read[b]].copy() if read[b] > 0 else np.zeros(pool.shape[1:])
        for t in range(x.shape[1]):
            xx = np.concatenate([win, x[b, t][:, None]], axis=1)
            acc = (xx * w).sum(1) + (0 if bias is None else bias)
            y[b, t] = _act(acc, activation) if write[b, t] > 0 else 0.0
            win = xx[:, 1:]
            if write[b, t] > 0:
                pool[write[b, t]] = win
    return y, pool


def prefill_inputs(seed: int, lengths, channels: int, width: int, pad: int = 3, slots: int = 13):
    """Inputs for rows of the given lengths plus `pad` padding tokens and one empty padding row."""
    rng = np.random.default_rng(seed)
    nrows = len(lengths) + 1
    qsl = np.concatenate([[0], np.cumsum(list(lengths) + [0])]).astype(np.int32)
    num_tokens = int(qsl[-1]) + pad
    perm = rng.permutation(np.arange(1, slots))
    read = perm[:nrows].astype(np.int32)
    write = perm[nrows : 2 * nrows].astype(np.int32)
    write[-1] = read[-1] = 0  # padding row
    has_init = rng.random(nrows) < 0.6
    has_init[-1] = False
    return dict(
        x=rng.standard_normal((num_tokens, channels)).astype(np.float32),
        weight=rng.standard_normal((channels, width)).astype(np.float32) * 0.5,
        bias=rng.standard_normal(channels).astype(np.float32),
        conv_state=rng.standard_normal((slots, channels, width - 1)).astype(np.float32),
        query_start_loc=qsl,
        has_initial_state=has_init,
        read_slots=read,
        write_slots=write,
    )


def update_inputs(seed: int, batch: int, lanes: int, channels: int, width: int, slots: int = 24):
    rng = np.random.default_rng(seed)
    perm = rng.permutation(np.arange(1, slots))
    read = perm[:batch].astype(np.int32)
    write = perm[batch : batch + batch * lanes].reshape(batch, lanes).astype(np.int32)
    read[-1] = 0  # a padding row: reads zeros, writes nothing
    write[-1] = 0
    if lanes > 1:
        write[0, -1] = 0  # a dead lane
    return dict(
        x=rng.standard_normal((batch, lanes, channels)).astype(np.float32),
        weight=rng.standard_normal((channels, width)).astype(np.float32) * 0.5,
        bias=rng.standard_normal(channels).astype(np.float32),
        conv_state=rng.standard_normal((slots, channels, width - 1)).astype(np.float32),
        read_slots=read,
        write_slots=write,
    )


def _args(d: dict, names: tuple[str, ...]):
    return [d[n] for n in names]


PREFILL = (
    "x",
    "weight",
    "bias",
    "conv_state",
    "query_start_loc",
    "has_initial_state",
    "read_slots",
    "write_slots",
)
UPDATE = ("x", "weight", "bias", "conv_state", "read_slots", "write_slots")


def rows_of(d: dict, boundary_slots=None, block_size=None) -> Rows:
    """The `Rows` of a prefill input dict (num_computed 0 unless given: the conv does not read
    it)."""
    num_computed = d.get("num_computed", np.zeros(len(d["read_slots"]), np.int32))
    return Rows(
        d["query_start_loc"],
        num_computed,
        d["has_initial_state"],
        d["read_slots"],
        d["write_slots"],
        boundary_slots,
        block_size,
    )


def prefill_args(d: dict) -> tuple:
    """The prefill op's arguments: x, weight, bias, conv_state and the `Rows`."""
    return (*_args(d, PREFILL[:4]), rows_of(d))


def check_prefill(d: dict, implementation: str, activation="silu", bias=True) -> None:
    if not bias:
        d = {**d, "bias": None}
    want_y, want_pool = oracle_prefill(*_args(d, PREFILL), activation)
    y, pool = ops.causal_conv1d_prefill(
        *prefill_args(d), activation=activation, implementation=implementation
    )
    np.testing.assert_allclose(np.asarray(y), want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(pool), want_pool, rtol=1e-6, atol=1e-6)


def check_update(d: dict, implementation: str, activation="silu") -> None:
    want_y, want_pool = oracle_update(*_args(d, UPDATE), activation)
    y, pool = ops.causal_conv1d_update(
        *_args(d, UPDATE), activation=activation, implementation=implementation
    )
    np.testing.assert_allclose(np.asarray(y), want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(pool), want_pool, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("lengths", [(5, 1, 2, 9), (1,), (3, 0, 12)])
def test_prefill_reference(lengths, activation):
    check_prefill(
        prefill_inputs(0, lengths, 12, 4), "reference", activation, bias=activation is None
    )


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_update_reference(lanes):
    check_update(update_inputs(1, 3, lanes, 10, 4), "reference")


def test_prefill_rejects_bad_weight():
    d = prefill_inputs(0, (3,), 8, 4)
    with pytest.raises(ValueError, match="weight"):
        ops.causal_conv1d_prefill(*prefill_args({**d, "weight": d["weight"][:4]}))


# (lengths, channels, width): short rows, empty rows, rows shorter than W - 1, several rows in one
# program, channel counts not multiples of block_d (8 in these tests). Each comes with the walk
# kernel's (walk_tokens, unroll).
PREFILL_SHAPES = (
    ((5, 1, 2, 9), 12, 4),
    ((1,), 6, 2),
    ((3, 0, 12), 20, 3),
    ((2, 1, 7), 12, 4),
    ((5, 1, 2, 9), 37, 4),
)
# Segments cut rows (at token 2 of a row with an initial window: the first window mixes it with x);
# tails shorter than `unroll` (T = 4 with unroll 8; T = 18 in 16-token segments, unroll 4).
WALK = ((4, 2), (8, 8), (16, 4), (4, 1), (2, 2))


def check_prefill_kernel(d: dict, activation="silu", **config) -> None:
    want_y, want_pool = oracle_prefill(*_args(d, PREFILL), activation)
    y, pool = conv_mod.causal_conv1d_prefill(
        *prefill_args(d), activation=activation, interpret=True, block_d=8, **config
    )
    np.testing.assert_allclose(np.asarray(y), want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(pool), want_pool, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("shape", "walk"), list(zip(PREFILL_SHAPES, WALK, strict=True)))
def test_prefill_walk_kernel(shape, walk):
    """The walk kernel; the second shape without bias and activation."""
    lengths, channels, width = shape
    d = prefill_inputs(5, lengths, channels, width)
    plain = shape == PREFILL_SHAPES[1]
    if plain:
        d["bias"] = None
    walk_tokens, unroll = walk
    check_prefill_kernel(d, None if plain else "silu", walk_tokens=walk_tokens, unroll=unroll)


@pytest.mark.parametrize(
    ("walk_tokens", "unroll", "bad"),
    [(8, 3, "unroll"), (8, 32, "unroll"), (2, 4, "walk_tokens"), (12, 4, "walk_tokens")],
)
def test_prefill_rejects_bad_walk(walk_tokens, unroll, bad):
    d = prefill_inputs(0, (3,), 8, 4)
    with pytest.raises(ValueError, match=bad):
        conv_mod.causal_conv1d_prefill(
            *prefill_args(d), interpret=True, walk_tokens=walk_tokens, unroll=unroll
        )


def test_prefill_kernel_no_bias_no_activation():
    check_prefill(prefill_inputs(6, (4, 2), 10, 4), "interpret", None, bias=False)


@pytest.mark.parametrize(("lanes", "width"), [(1, 4), (2, 4), (3, 2), (4, 4)])
def test_update_kernel(lanes, width):
    """K = 0..3 speculative lanes; a padding row and a dead lane."""
    check_update(update_inputs(7, 3, lanes, 10, width), "interpret")


@pytest.mark.parametrize("num_rows", [1, 2, 37])
def test_prefill_kernel_lowers_for_triton(num_rows):
    """The Pallas -> Triton lowering (no PTX compile) at the benchmark's channel count; the row
    ends load as a vector of at least two lanes."""

    import jax
    import jax.numpy as jnp

    from pallas_kernels._common import lower_for_cuda

    sds, i32 = jax.ShapeDtypeStruct, jnp.int32
    args = (
        sds((1000, 8192), jnp.bfloat16),
        sds((8192, 4), jnp.bfloat16),
        sds((8192,), jnp.bfloat16),
        sds((5, 8192, 3), jnp.bfloat16),
        sds((num_rows + 1,), i32),
        sds((num_rows,), i32),
        sds((num_rows,), jnp.bool_),
        sds((num_rows,), i32),
        sds((num_rows,), i32),
    )

    def prefill(*a):
        return conv_mod.causal_conv1d_prefill(*a[:4], Rows(*a[4:]))

    assert "causal_conv1d_prefill" in lower_for_cuda(prefill, *args)


def oracle_boundary_states(x, pool, qsl, num_computed, has_init, read, boundary, block_size):
    """Row by row in float64: the last W - 1 inputs before each boundary inside the row."""
    src, out = pool.astype(np.float64), pool.astype(np.float64).copy()
    for r in range(len(qsl) - 1):
        init = src[read[r]] if (has_init[r] and read[r] > 0) else np.zeros(pool.shape[1:])
        xx = np.concatenate([init, x[qsl[r] : qsl[r + 1]].T.astype(np.float64)], axis=1)
        for j, slot in enumerate(boundary[r]):
            before = (num_computed[r] // block_size + j + 1) * block_size - num_computed[r]
            if slot > 0 and before <= qsl[r + 1] - qsl[r]:
                out[slot] = xx[:, before : before + pool.shape[2]]
    return out


@pytest.mark.parametrize("width", [2, 4])
def test_boundary_states_match_a_numpy_loop(width):
    """Rows starting on and off a block boundary, boundaries within W - 1 tokens of a row start
    (the window reaches into the initial state), a column past the row's end and NULL columns
    (nothing written), a padding row; slot 0 holds NaN and stays untouched."""
    bs = 8
    args = prefill_inputs(3, [21, 9, 17], channels=12, width=width, slots=24)
    del args["weight"], args["bias"]
    args["write_slots"][:] = 0  # the op writes no final windows
    args["conv_state"][0] = np.nan
    args["has_initial_state"] = np.array([True, True, False, False])
    num_computed = np.array([16, 6, 0, 0], np.int32)  # row 1: boundary 8 is 2 tokens in
    boundary = np.array([[13, 14, 15], [16, 0, 17], [18, 19, 20], [0, 0, 0]], np.int32)
    rows = rows_of({**args, "num_computed": num_computed}, boundary, bs)
    pool = ops.causal_conv1d_boundary_states(args["x"], args["conv_state"], rows)
    want = oracle_boundary_states(
        args["x"],
        args["conv_state"],
        args["query_start_loc"],
        num_computed,
        args["has_initial_state"],
        args["read_slots"],
        boundary,
        bs,
    )
    np.testing.assert_allclose(np.asarray(pool)[1:], want[1:], rtol=0, atol=1e-6)
    assert np.isnan(np.asarray(pool)[0]).all()
    written = {13, 14, 16, 18, 19}  # row 0: 24, 32; row 1: 8 (17 is past 13); row 2: 8, 16
    for slot in set(range(13, 21)) - written:
        np.testing.assert_array_equal(np.asarray(pool)[slot], args["conv_state"][slot])


def test_boundary_window_equals_the_final_window_of_a_row_cut_there():
    """What prefix caching relies on: the window cached at a boundary inside a row is what the
    prefill writes as the final window of the same row cut at that boundary."""
    args = prefill_inputs(5, [19], channels=6, width=4, slots=8)
    bs, read = 8, args["read_slots"]
    num_computed = np.array([8, 0], np.int32)
    has_init = np.array([True, False])
    boundary = np.array([[3, 4], [0, 0]], np.int32)  # positions 16 and 24 (row ends at 27)
    no_write = np.zeros(2, np.int32)
    rows = Rows(args["query_start_loc"], num_computed, has_init, read, no_write, boundary, bs)
    pool = np.asarray(ops.causal_conv1d_boundary_states(args["x"], args["conv_state"], rows))
    for slot, cut in ((3, 8), (4, 16)):
        qsl = np.array([0, cut, cut], np.int32)
        cut_rows = Rows(qsl, num_computed, has_init, read, np.array([7, 0], np.int32))
        _, cut_pool = ops.causal_conv1d_prefill(
            args["x"], args["weight"], args["bias"], args["conv_state"], cut_rows
        )
        np.testing.assert_array_equal(pool[slot], np.asarray(cut_pool)[7])
