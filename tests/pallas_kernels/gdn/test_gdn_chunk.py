"""Gated DeltaNet prefill: token reference vs chunked reference vs fp64 oracle (and the kernel)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.gdn import chunk as gdn_chunk_module
from pallas_kernels.gdn import intra
from pallas_kernels.gdn import reference as ref
from pallas_kernels.gdn.chunk import ChunkTuning, gdn_chunk
from pallas_kernels.gdn.reference_chunked import gdn_chunk_reference_chunked
from pallas_kernels.rows import Rows
from tests.compiled import per_module

from . import gdn_oracle
from .gdn_oracle import lower_for_cuda

HK, HV, K, V = 2, 4, 16, 16
DIMS = (HK, HV, K, V)


def make_case(lengths, nc, has_init, *, T=None, seed=0, decay=1.0, nb=0, bs=None, dims=DIMS):
    """numpy inputs for rows of `lengths` tokens (padded to T); slots 1.. in order, garbage pool.

    dims = (HK, HV, K, V): key heads, value heads, key and value head dims."""
    HK, HV, K, V = dims
    rng = np.random.default_rng(seed)
    R = len(lengths)
    T = T or sum(lengths)
    qsl = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    g = (-decay * np.logaddexp(0, f(T, HV))).astype(np.float32)
    beta = (1 / (1 + np.exp(-f(T, HV)))).astype(np.float32)
    state = f(2 * R + 2 + R * nb, HV, V, K)
    state[0] = np.nan  # NULL slot poisoned: must never be read
    rs = np.arange(1, R + 1, dtype=np.int32)
    ws = np.arange(R + 1, 2 * R + 1, dtype=np.int32)
    args = [
        f(T, HK, K),
        f(T, HK, K),
        f(T, HV, V),
        g,
        beta,
        state,
        qsl,
        np.asarray(nc, np.int32),
        np.asarray(has_init, bool),
        rs,
        ws,
    ]
    kw = {}
    if nb:
        bslots = np.arange(2 * R + 1, 2 * R + 1 + R * nb, dtype=np.int32).reshape(R, nb)
        kw = dict(block_size=bs, boundary_slots=bslots)
    return args, kw


def as_rows(args, block_size=None, boundary_slots=None) -> tuple:
    """make_case's 11 arrays as an op's arguments: q, k, v, g, beta, the pool, then the `Rows`."""
    return (*args[:6], Rows(*args[6:11], boundary_slots=boundary_slots, block_size=block_size))


def check(o, st, args, kw, *, tol=2e-4):
    o_ref, st_ref = gdn_oracle.prefill(*args, **kw)
    live = int(args[6][-1])
    np.testing.assert_allclose(np.asarray(o)[:live], o_ref[:live], rtol=tol, atol=tol)
    assert np.all(np.asarray(o)[live:] == 0)
    st = np.asarray(st)
    assert np.isnan(st[0]).all()  # slot 0 untouched
    np.testing.assert_allclose(st[1:], st_ref[1:], rtol=tol, atol=tol)


CASES = {
    "one_token": ([1], [0], [False]),
    "across_chunks": ([37], [5], [True]),
    "several_in_chunk": ([3, 5, 4, 2], [0, 7, 14, 30], [False, True, True, False]),
    "mixed": ([20, 1, 17], [11, 63, 0], [True, True, False]),
    "straddling": ([2] * 6, [15, 31, 7, 15, 47, 15], [True] * 6),  # 2 chunks for each 2-token row
}


@per_module
def _jitted(fn, chunk_size, nb):
    def run(*a, block_size=None, boundary_slots=None):
        return fn(*as_rows(a, block_size, boundary_slots), chunk_size=chunk_size)

    return jax.jit(run, static_argnames=("block_size",))


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("form", ["token", "chunked"])
def test_reference_matches_oracle(name, form):
    lengths, nc, hi = CASES[name]
    args, kw = make_case(lengths, nc, hi, T=48, seed=len(name))
    fn = ref.gdn_chunk_reference if form == "token" else gdn_chunk_reference_chunked
    o, st = _jitted(fn, 8, 0)(*map(jnp.asarray, args))
    check(o, st, args, kw)


@pytest.mark.parametrize("form", ["token", "chunked"])
def test_reference_boundary_states(form):
    args, kw = make_case([21, 9, 40], [3, 16, 0], [True, False, True], T=72, nb=3, bs=16)
    kw["boundary_slots"][1, 0] = 0  # padding boundary slot: skipped
    fn = ref.gdn_chunk_reference if form == "token" else gdn_chunk_reference_chunked
    jargs = list(map(jnp.asarray, args))
    o, st = _jitted(fn, 8, 3)(
        *jargs, block_size=16, boundary_slots=jnp.asarray(kw["boundary_slots"])
    )
    check(o, st, args, kw)


def test_chunked_equals_token_strong_decay():
    """Strong decay (|g| large) and chunk 16: the two jnp forms agree."""
    args, kw = make_case([30, 50], [9, 0], [True, False], T=96, seed=3, decay=8.0)
    jargs = list(map(jnp.asarray, args))
    o1, s1 = _jitted(ref.gdn_chunk_reference, 16, 0)(*jargs)
    o2, s2 = _jitted(gdn_chunk_reference_chunked, 16, 0)(*jargs)
    np.testing.assert_allclose(np.asarray(o1), np.asarray(o2), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(s1)[1:], np.asarray(s2)[1:], rtol=1e-4, atol=1e-4)


def test_bad_shapes_raise():
    args, _ = make_case([4], [0], [False])
    args[3] = args[3][:, :3]
    with pytest.raises(ValueError, match="g has shape"):
        ref.gdn_chunk_reference(*as_rows(list(map(jnp.asarray, args))))


def _kernel(C, knobs=None, **kw):
    """The kernel in interpret mode at chunk C, with 4-blocked inverses and V tiles of 8."""
    tuning = ChunkTuning(solve_block=4, block_v=8, **(knobs or {}))

    def run(*a, block_size=None, boundary_slots=None):
        rows = as_rows(a, block_size, boundary_slots)
        return gdn_chunk(*rows, interpret=True, chunk_size=C, tuning=tuning, **kw)

    return run


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_interpret(name):
    """Length 1, across chunks, several rows in one chunk, garbage slots without initial state."""
    lengths, nc, hi = CASES[name]
    args, kw = make_case(lengths, nc, hi, T=48, seed=len(name))
    o, st = _kernel(16)(*map(jnp.asarray, args))
    check(o, st, args, kw)


@pytest.mark.parametrize("l2", [True, False])
def test_kernel_interpret_qk_options(l2):
    """Varlen rows starting mid-chunk, initial state mixed, use_qk_l2norm on and off with a given
    scale: kernel 1 builds KD, QE and AQK from q, k, so both flags must reach it."""
    lengths, nc, hi = [20, 1, 17, 9], [11, 63, 0, 30], [True, True, False, False]
    args, kw = make_case(lengths, nc, hi, T=56, seed=11)
    if not l2:  # keep |k| near 1 so the unnormalised delta rule stays contracting
        args[0], args[1] = args[0] * 0.3, args[1] * 0.3
    o, st = _kernel(16, use_qk_l2norm=l2, scale=0.7)(*map(jnp.asarray, args))
    o_ref, st_ref = gdn_oracle.prefill(*args, scale=0.7, l2=l2)
    live = sum(lengths)
    np.testing.assert_allclose(np.asarray(o)[:live], o_ref[:live], rtol=2e-4, atol=2e-4)
    assert np.all(np.asarray(o)[live:] == 0)
    st = np.asarray(st)
    assert np.isnan(st[0]).all()
    np.testing.assert_allclose(st[1:], st_ref[1:], rtol=2e-4, atol=2e-4)


def test_kernel_interpret_boundaries_chunk64():
    """Default chunk 64 with its 16-blocked inverse, boundary states, a padding boundary slot."""
    args, kw = make_case([70, 3, 90], [10, 64, 0], [True, True, False], T=176, nb=2, bs=64)
    kw["boundary_slots"][2, 1] = 0
    tuning = ChunkTuning(block_v=8)
    rows = as_rows(list(map(jnp.asarray, args)), 64, jnp.asarray(kw["boundary_slots"]))
    o, st = gdn_chunk(*rows, interpret=True, tuning=tuning)
    check(o, st, args, kw, tol=5e-4)


# Head dims that are not powers of two, odd head counts: the padding columns of every tile (on the
# GPU those of kernel 1's outputs were never written; interpret mode fills such memory with NaN).
ODD_DIMS = [(1, 1, 24, 12), (1, 5, 48, 20), (3, 6, 12, 24)]


@pytest.mark.parametrize("dims", ODD_DIMS)
def test_kernel_interpret_odd_dims(dims):
    """Three chunks and more (the GPU bug showed from the third chunk on), boundaries, offsets."""
    args, kw = make_case([1, 35, 9], [0, 5, 16], [False, True, True], T=48, nb=3, bs=16, dims=dims)
    o, st = _kernel(16)(*map(jnp.asarray, args), **kw)
    check(o, st, args, kw)


def test_interpret_mode_poisons_unwritten_memory():
    """What the odd-shape tests rely on: interpret mode fills output memory that a kernel never
    wrote with NaN (on the GPU it holds whatever was there before), so a read of it shows."""

    def kernel(o_ref):
        plgpu.store(o_ref.at[pl.ds(0, 4)], jnp.ones((4,), jnp.float32))

    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((8,), jnp.float32),
        compiler_params=plgpu.CompilerParams(num_warps=1, num_stages=1),
        interpret=True,
    )()
    assert np.all(np.asarray(out[:4]) == 1) and np.isnan(np.asarray(out[4:])).all()


@pytest.mark.parametrize("split", [False, True])
def test_intra_tiles_are_written_whole(split):
    """Every element of kernel 1's tiles is written, padding columns (K..BK, V..BV) as zeros."""
    args, _ = make_case([1, 35, 9], [0, 5, 16], [False, True, True], T=48, dims=(1, 2, 24, 12))
    q, k, v, g, beta = map(jnp.asarray, args[:5])
    cstart, clen, _, _ = gdn_chunk_module.chunk_tiles(
        jnp.asarray(args[6]), jnp.asarray(args[7]), 48, 16
    )
    spec = intra.IntraSpec(
        heads_per_key=2,
        chunk=16,
        k_dim=24,
        v_dim=12,
        block_k=32,
        block_v=16,
        dtype=jnp.float32,
        solve_dtype=jnp.float32,
        precision=None,
        scale=24**-0.5,
        l2norm=True,
        solve_block=4,
        solve_refine=False,
    )
    tiles = intra.intra_tiles(
        q, k, v, g, beta, cstart, clen, spec, num_warps=4, split=split, interpret=True
    )
    for tile in tiles:
        assert np.isfinite(np.asarray(tile)).all()
    w, u = (np.asarray(t) for t in tiles[:2])
    assert not w[..., 24:].any() and not u[..., 12:].any()


def test_kernel_lowers_for_triton():
    args, _ = make_case([5, 20], [3, 0], [True, False], T=32)
    text = lower_for_cuda(
        lambda *a: gdn_chunk(*as_rows(a), interpret=False, chunk_size=16), *map(jnp.asarray, args)
    )
    assert "triton" in text


@pytest.mark.parametrize("solve", ["f32", "bf16_newton"])
def test_kernel_interpret_bf16(solve):
    """bf16 inputs: bf16 tiles and dot operands (the GPU default), RMS error within FLA's 5e-3."""
    args, kw = make_case([37, 20], [5, 0], [True, False], T=64, seed=7)
    for i in (0, 1, 2):  # q, k, v in bf16; the oracle sees the same rounded values
        args[i] = np.asarray(jnp.asarray(args[i]).astype(jnp.bfloat16))
    knobs = {} if solve == "f32" else dict(solve_dtype=jnp.bfloat16, solve_refine=True)
    knobs["split_intra"] = solve != "f32"  # the two-launch kernel 1 as well
    o, st = _kernel(16, knobs)(*map(jnp.asarray, args))
    o_ref, st_ref = gdn_oracle.prefill(*[np.asarray(a, np.float32) for a in args[:3]], *args[3:])
    o = np.asarray(o, np.float64)[:57]
    err_o = np.sqrt(np.mean((o - o_ref[:57]) ** 2) / np.mean(o_ref[:57] ** 2))
    st = np.asarray(st)
    err_s = np.sqrt(np.mean((st[1:] - st_ref[1:]) ** 2) / np.mean(st_ref[1:] ** 2))
    assert np.isnan(st[0]).all()
    assert np.all(o[57:] == 0)
    assert err_o < 5e-3 and err_s < 5e-3, (err_o, err_s)
