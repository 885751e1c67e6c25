"""fp64 numpy oracle for the Gated DeltaNet ops (a plain loop, independent of the jnp code)."""

from __future__ import annotations

import numpy as np


def _prep(x: np.ndarray, rep: int, scale: float | None, l2: bool) -> np.ndarray:
    x = x.astype(np.float64)
    if l2:
        x = x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)
    if scale is not None:
        x = x * scale
    return np.repeat(x, rep, axis=-2)


def _step(s, q, k, v, g, beta):
    s = s * np.exp(g)[:, None, None]
    delta = beta[:, None] * (v - np.einsum("hvk,hk->hv", s, k))
    s = s + delta[:, :, None] * k[:, None, :]
    return s, np.einsum("hvk,hk->hv", s, q)


def prefill(
    q,
    k,
    v,
    g,
    beta,
    state,
    qsl,
    nc,
    has_init,
    rs,
    ws,
    *,
    block_size=None,
    boundary_slots=None,
    scale=None,
    l2=True,
):
    """Returns (o [T, HV, V], new state pool) in fp64."""
    T, HV, V = v.shape
    rep = HV // q.shape[1]
    qf = _prep(q, rep, q.shape[-1] ** -0.5 if scale is None else scale, l2)
    kf = _prep(k, rep, None, l2)
    o = np.zeros((T, HV, V))
    new = np.array(state, np.float64)
    for r in range(len(nc)):
        s = (
            state[rs[r]].astype(np.float64)
            if (has_init[r] and rs[r] > 0)
            else np.zeros(state.shape[1:])
        )
        nb = 0
        for t in range(qsl[r], qsl[r + 1]):
            s, o[t] = _step(s, qf[t], kf[t], v[t].astype(np.float64), g[t], beta[t])
            p = nc[r] + t - qsl[r]
            if block_size and (p + 1) % block_size == 0:
                if nb < boundary_slots.shape[1] and boundary_slots[r, nb] > 0:
                    new[boundary_slots[r, nb]] = s
                nb += 1
        if ws[r] > 0:
            new[ws[r]] = s
    return o, new


def decode(q, k, v, a, b, A_log, dt_bias, state, rs, ws, *, scale=None, l2=True):
    """Returns (o [B, L, HV, V], new state pool) in fp64."""
    Bn, L, HV, V = v.shape
    rep = HV // q.shape[2]
    qf = _prep(q, rep, q.shape[-1] ** -0.5 if scale is None else scale, l2)
    kf = _prep(k, rep, None, l2)
    g = -np.exp(A_log.astype(np.float64)) * np.logaddexp(0.0, a + dt_bias)
    beta = 1.0 / (1.0 + np.exp(-b.astype(np.float64)))
    o = np.zeros((Bn, L, HV, V))
    new = np.array(state, np.float64)
    for i in range(Bn):
        s = state[rs[i]].astype(np.float64) if rs[i] > 0 else np.zeros(state.shape[1:])
        for t in range(L):
            s, ot = _step(s, qf[i, t], kf[i, t], v[i, t].astype(np.float64), g[i, t], beta[i, t])
            if ws[i, t] > 0:
                o[i, t] = ot
                new[ws[i, t]] = s
    return o, new


def lower_for_cuda(f, *args, device_kind="NVIDIA H100 80GB HBM3", num_cores=132) -> str:
    """Lower `f` for CUDA on this CPU machine (Triton IR, no PTX): catches non-pow2 shapes etc."""
    import jax
    from jax.sharding import AbstractDevice, AbstractMesh

    ad = AbstractDevice(device_kind=device_kind, num_cores=num_cores, platform="gpu")
    with jax.sharding.use_abstract_mesh(AbstractMesh((1,), ("_",), abstract_device=ad)):
        return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
