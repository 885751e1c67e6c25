"""Grid points of the Gated DeltaNet kernels: the fused decode, the chunked prefill and the state
update."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from benchmarks.checks.kernels.case import F32, TOLERANCE, Case, Shape, without_interpret
from benchmarks.checks.kernels.fused_decode import fused_decode_case
from benchmarks.checks.kernels.layouts import (
    lane_live,
    lanes,
    normal,
    random_pool,
    row_lengths,
    varlen,
)
from pallas_kernels.gdn import chain_mgpu as gdn_hopper
from pallas_kernels.gdn import chunk as gdnc
from pallas_kernels.gdn import decode as gdnd
from pallas_kernels.gdn import reference as gdn_ref
from pallas_kernels.gdn import state_update as gdnu


def gdn_decode(
    hk: int, hv: int, k: int, v: int, width: int, num_lanes: int, dtype, batch: int = 6
) -> Shape:
    conv_dim = 2 * hk * k + hv * v

    def build(rng) -> Case:
        after = (normal(rng, (hv,), F32, 0.5), normal(rng, (hv,), F32, 0.5))
        fns = (gdnd.gdn_decode, gdn_ref.gdn_decode_reference)
        return fused_decode_case(
            rng,
            fns,
            conv_dim + hv * v + 2 * hv,
            (conv_dim, width - 1),
            (hv, v, k),
            after,
            num_lanes,
            dtype,
            batch,
        )

    dims = f"HK={hk} HV={hv} K={k} V={v} W={width} L={num_lanes}"
    return Shape(f"gdn_decode {dims} {jnp.dtype(dtype).name}", build)


def gdn_chunk(
    hk: int,
    hv: int,
    k: int,
    v: int,
    dtype,
    chunk: int = 64,
    hopper: bool = False,
    caching: bool = True,
) -> Shape:
    """The op with its default tuning; with `hopper`, the Mosaic GPU chain (sm_90 only); without
    `caching`, rows without boundary slots (the calls of an engine without prefix caching)."""
    kernel = gdnc.gdn_chunk
    if hopper:
        kernel = without_interpret(gdn_hopper.gdn_chunk_hopper)

    def build(rng) -> Case:
        rows = varlen(rng, row_lengths(chunk), chunk)
        t = rows.num_tokens
        args = (
            normal(rng, (t, hk, k), dtype),
            normal(rng, (t, hk, k), dtype),
            normal(rng, (t, hv, v), dtype),
            -np.logaddexp(0.0, normal(rng, (t, hv))).astype(np.float32),
            1.0 / (1.0 + np.exp(-normal(rng, (t, hv)))),
            random_pool(rng, rows.num_slots, (hv, v, k), F32),
            rows.as_rows(chunk if caching else None),
        )

        def call(fn, *a, **kw):
            return fn(*a, chunk_size=chunk, **kw)

        return Case(
            functools.partial(call, kernel),
            functools.partial(call, gdn_ref.gdn_chunk_reference),
            args,
            5,
            rows.live[:, None, None],
            rows.written,
            TOLERANCE[dtype, "scan"],
            rows.describe(),
        )

    name = "gdn_chunk hopper" if hopper else "gdn_chunk"
    dims = f"HK={hk} HV={hv} K={k} V={v} chunk={chunk}{'' if caching else ' uncached'}"
    dims += f" {jnp.dtype(dtype).name}"
    return Shape(f"{name} {dims}", build)


def gdn_update(hk: int, hv: int, k: int, v: int, num_lanes: int, dtype, batch: int = 6) -> Shape:
    def build(rng) -> Case:
        read, write, num_slots = lanes(rng, batch, num_lanes)
        lead = (batch, num_lanes)
        args = (
            normal(rng, (*lead, hk, k), dtype),
            normal(rng, (*lead, hk, k), dtype),
            normal(rng, (*lead, hv, v), dtype),
            normal(rng, (*lead, hv), dtype),
            normal(rng, (*lead, hv), dtype),
            normal(rng, (hv,), F32, 0.5),
            normal(rng, (hv,), F32, 0.5),
            random_pool(rng, num_slots, (hv, v, k), F32),
            read,
            write,
        )
        return Case(
            gdnu.gdn_state_update,
            gdn_ref.gdn_state_update_reference,
            args,
            7,
            lane_live(write, 2),
            write.ravel(),
            TOLERANCE[dtype, "update"],
            f"B={batch} L={num_lanes}",
        )

    return Shape(
        f"gdn_state_update HK={hk} HV={hv} K={k} V={v} L={num_lanes} {jnp.dtype(dtype).name}", build
    )
