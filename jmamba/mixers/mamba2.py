"""The Mamba2 mixer (SSD) and its per-slot state.

Glossary (paper symbol: code name): x_t: x, Delta_t: dt, A: A (negative, one per head; checkpoints
store A_log = log(-A)), B_t/C_t: B/C (shared by the heads of a group), D: skip, z: output gate.

    [z | xBC | dt] = x W_in
    xBC            = silu(causal_conv1d(xBC))           (depthwise, width d_conv)
    [x | B | C]    = xBC
    h_t            = exp(Delta_t A) h_{t-1} + Delta_t x_t B_t^T,   Delta_t = softplus(dt + dt_bias)
    y_t            = h_t C_t + D x_t
    out            = groupnorm(y * silu(z)) W_out       (or groupnorm(y) * silu(z), or y * silu(z))

The parameter is A itself (fp32, `a_from_log` at load), so a step computes no -exp(A_log); the
writer maps it back with `log_from_a`. A, D, dt_bias, the conv taps and the norm weight stay fp32
in a bf16 model (`Fp32Param`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Generic

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from typing_extensions import TypeVar

from jmamba.layer_configs import Mamba2Config
from jmamba.layers.fp32_param import Fp32Param
from jmamba.layers.linear import Linear
from jmamba.layers.norms import GroupGatedRMSNorm, SiluGate
from jmamba.mixers.boundary_states import kernel_rows, write_conv_windows
from jmamba.mixers.token_layout import run_by_section
from jmamba.parallel.collectives import WHOLE, TensorParallel
from jmamba.parallel.rules import Segment, ShardRule, split
from jmamba.step.pytree import StepInputs
from pallas_kernels import ops


def a_from_log(a_log: np.ndarray) -> np.ndarray:
    """A = -exp(A_log) as fp32, computed in float64 (so rounded once) on the host."""
    return (-np.exp(np.asarray(a_log, np.float64))).astype(np.float32)


def log_from_a(a: np.ndarray) -> np.ndarray:
    """The fp32 A_log that `a_from_log` maps back to `a` exactly, where one lies within two ulps
    of log(-a) (always, for an A that `a_from_log` made); otherwise the nearest, log(-a).

    Several fp32 A_log may give the same A (exp is flatter than the fp32 grid for |A_log| < 1),
    so a checkpoint's own A_log can come back one ulp away; it still loads to the same A.
    """
    a = np.asarray(a, np.float32)
    nearest = np.log(-a.astype(np.float64)).astype(np.float32)
    candidates, up, down = [nearest], nearest, nearest
    for _ in range(2):
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
        candidates += [up, down]
    out = nearest
    for candidate in reversed(candidates):  # the nearest last: it wins over its neighbours
        out = np.where(a_from_log(candidate) == a, candidate, out)
    return out


# A leaf of the cache: an array, or in `tp_axes` the axis of that array that tensor parallelism
# splits (the same pytree).
_Leaf = TypeVar("_Leaf", default=jax.Array)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Mamba2State(Generic[_Leaf]):
    """Recurrent state of one Mamba2 layer for every state slot (slot 0 is NULL).

    Attributes:
      conv: [num_slots, conv_dim, d_conv - 1] last inputs of the causal conv, newest last.
      ssm: [num_slots, num_heads, head_dim, d_state] SSM hidden state (fp32 by default,
        bf16 allowed: `jmamba.cache_dtypes`).
    """

    conv: _Leaf
    ssm: _Leaf

    @staticmethod
    def zeros(
        cfg: Mamba2Config, num_slots: int, dtype: jnp.dtype, ssm_dtype: jnp.dtype = jnp.float32
    ) -> Mamba2State:
        return Mamba2State(
            jnp.zeros((num_slots, cfg.conv_dim, cfg.d_conv - 1), dtype),
            jnp.zeros((num_slots, cfg.num_heads, cfg.head_dim, cfg.d_state), ssm_dtype),
        )

    @staticmethod
    def tp_axes() -> Mamba2State[int]:
        """The axis of each array that tensor parallelism splits: conv channels, SSM heads."""
        return Mamba2State(1, 1)


def _units(cfg: Mamba2Config) -> tuple[Segment, Segment, Segment]:
    """Heads (head_dim channels each), B or C groups (d_state each) and heads as scalars."""
    heads = Segment("mamba2.num_heads", cfg.num_heads, cfg.head_dim)
    groups = Segment("mamba2.n_groups", cfg.n_groups, cfg.d_state, replicable=True)
    return heads, groups, dataclasses.replace(heads, unit_size=1)


def mamba2_shard(cfg: Mamba2Config, shards: int) -> Mamba2Config:
    """The config of one of `shards` tensor-parallel shards: its heads, and its B/C groups (the
    one its heads use when there are fewer groups than shards; the gated norm's group then spans
    shards / n_groups shards)."""
    heads, groups, _ = _units(cfg)
    local_groups = groups.local_units(shards)
    return dataclasses.replace(
        cfg,
        num_heads=heads.local_units(shards),
        n_groups=local_groups,
        norm_group_shards=max(1, shards // cfg.n_groups),
    )


def mamba2_tp_rules(cfg: Mamba2Config) -> dict[tuple[str, ...], ShardRule]:
    """SSM heads over tp with their conv channels, A, D and dt_bias; B/C groups over tp or
    replicated; the gated norm's weight with its heads; out_proj row-parallel."""
    heads, groups, scalars = _units(cfg)
    conv = split(0, heads, groups, groups)  # [x | B | C]
    rules = {
        ("in_proj", "kernel"): split(1, heads, heads, groups, groups, scalars),  # z x B C dt
        ("conv_weight",): conv,
        ("dt_bias",): split(0, scalars),
        ("A",): split(0, scalars),
        ("D",): split(0, scalars),
        ("out_proj", "kernel"): split(0, heads),
    }
    if cfg.conv_bias:
        rules[("conv_bias",)] = conv
    if cfg.gate_norm != "gate_only":
        rules[("norm", "weight")] = split(0, heads)
    return rules


def gate_norm(
    cfg: Mamba2Config, eps: float, tp: TensorParallel = WHOLE
) -> GroupGatedRMSNorm | SiluGate:
    """The module `(y, z) -> gated y` of `cfg.gate_norm` (see `Mamba2Config`); `tp` sums the
    squares of a norm group that spans `cfg.norm_group_shards` shards."""
    if cfg.gate_norm == "gate_only":
        return SiluGate()
    group_size = cfg.d_inner // cfg.n_groups
    return GroupGatedRMSNorm(
        cfg.d_inner,
        group_size,
        eps,
        cfg.gate_norm == "norm_then_gate",
        tp=tp,
        span=cfg.norm_group_shards,
    )


class Mamba2(nnx.Module):
    """The Mamba2 token mixer: `(x, state, inputs) -> (y, new_state)`."""

    def __init__(
        self,
        hidden: int,
        cfg: Mamba2Config,
        norm_eps: float,
        *,
        rngs: nnx.Rngs,
        tp: TensorParallel = WHOLE,
    ):
        self.cfg = cfg
        self.in_proj = Linear(
            hidden, 2 * cfg.d_inner + 2 * cfg.n_groups * cfg.d_state + cfg.num_heads, rngs=rngs
        )
        key = rngs.params()
        self.conv_weight = Fp32Param(
            jax.random.normal(key, (cfg.conv_dim, cfg.d_conv), jnp.float32) / cfg.d_conv**0.5
        )
        if cfg.conv_bias:
            self.conv_bias = Fp32Param(jnp.zeros((cfg.conv_dim,), jnp.float32))
        self.dt_bias = Fp32Param(jnp.ones((cfg.num_heads,), jnp.float32))
        a_log = np.log(np.arange(1, cfg.num_heads + 1, dtype=np.float32))
        self.A = Fp32Param(jnp.asarray(a_from_log(a_log)))
        self.D = Fp32Param(jnp.ones((cfg.num_heads,), jnp.float32))
        self.norm = gate_norm(cfg, norm_eps if cfg.gate_norm_eps is None else cfg.gate_norm_eps, tp)
        self.out_proj = Linear(cfg.d_inner, hidden, rngs=rngs)

    def _conv_args(self) -> tuple[jax.Array, jax.Array | None]:
        bias = self.conv_bias[...] if self.cfg.conv_bias else None
        return self.conv_weight[...], bias

    def _ssm_kwargs(self) -> dict:
        return dict(
            D=self.D[...],
            dt_bias=self.dt_bias[...],
            dt_softplus=True,
            dt_limit=self.cfg.dt_limit,
        )

    def _split_xbc(self, xbc: jax.Array):
        cfg = self.cfg
        gn = cfg.n_groups * cfg.d_state
        x, b, c = jnp.split(xbc, [cfg.d_inner, cfg.d_inner + gn], axis=-1)
        lead = xbc.shape[:-1]
        return (
            x.reshape(*lead, cfg.num_heads, cfg.head_dim),
            b.reshape(*lead, cfg.n_groups, cfg.d_state),
            c.reshape(*lead, cfg.n_groups, cfg.d_state),
        )

    def _decode(self, inputs: StepInputs, zxbcdt, state: Mamba2State):
        """One fused op over in_proj's output [R_d, W, d_in_proj]: conv, split and state update."""
        rows = inputs.decode
        y, conv, ssm = ops.mamba2_decode(
            zxbcdt,
            *self._conv_args(),
            state.conv,
            state.ssm,
            self.A[...],
            rows.read_slots,
            rows.write_slots,
            **self._ssm_kwargs(),
        )
        return y, Mamba2State(conv, ssm)

    def _prefill(self, inputs: StepInputs, xbc, dt, state: Mamba2State):
        rows = kernel_rows(inputs.prefill)
        xbc, conv = ops.causal_conv1d_prefill(
            xbc,
            *self._conv_args(),
            write_conv_windows(xbc, state.conv, rows),
            rows,
            activation="silu",
        )
        x, b, c = self._split_xbc(xbc)
        a = self.A[...]
        y, ssm = ops.ssd_chunk_scan(
            x,
            dt,
            a,
            b,
            c,
            state.ssm,
            rows,
            chunk_size=self.cfg.chunk_size,
            algorithm=self.cfg.scan_algorithm,
            **self._ssm_kwargs(),
        )
        return y, Mamba2State(conv, ssm)

    def __call__(
        self, hidden: jax.Array, state: Mamba2State, inputs: StepInputs
    ) -> tuple[jax.Array, Mamba2State]:
        cfg = self.cfg
        zxbcdt = self.in_proj(hidden)
        z, xbc, dt = jnp.split(zxbcdt, [cfg.d_inner, cfg.d_inner + cfg.conv_dim], axis=-1)
        # Decode reads in_proj's output by column offset, prefill its split columns.
        y, state = run_by_section(
            inputs,
            state,
            (zxbcdt,),
            (xbc, dt),
            functools.partial(self._decode, inputs),
            functools.partial(self._prefill, inputs),
            (cfg.num_heads, cfg.head_dim),
            hidden.dtype,
        )
        y = y.reshape(hidden.shape[0], cfg.d_inner)
        return self.out_proj(self.norm(y, z)), state
