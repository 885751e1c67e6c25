"""One frozen config per layer kind: attention, Mamba2, Gated DeltaNet, the dense MLP, the MoE and
Zamba2's shared transformer block. `jmamba.config.ModelConfig` holds one of each kind its layers
use.
"""

from __future__ import annotations

import dataclasses
import math

GDN_CHUNK_SIZE = 64  # the Gated DeltaNet prefill chunk (fixed in every reference implementation)
SCAN_ALGORITHMS = ("sequential", "parallel")  # the Mamba2 prefill scan kernels
# How the Mamba2 output y meets its gate z (`Mamba2Config.gate_norm`).
GATE_NORMS = ("gate_then_norm", "norm_then_gate", "gate_only")


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Softmax attention over a paged KV cache.

    `rotary_dim` = 0 means no rotary embedding (NemotronH). `output_gate` is Qwen3-Next's
    per-head sigmoid gate packed into q_proj; `qk_norm` its per-head RMSNorm of q and k.
    `softmax_scale` multiplies q k^T before the softmax: None is 1 / sqrt(head_dim), a number is
    the checkpoint's own (Granite's `attention_multiplier`); `scale` is the one in use (the same
    on every tensor-parallel shard of the heads).
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int = 0
    rope_theta: float = 10000.0
    output_gate: bool = False
    qk_norm: bool = False
    softmax_scale: float | None = None

    def __post_init__(self) -> None:
        require(
            self.num_heads % self.num_kv_heads == 0,
            f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}",
        )
        require(
            0 <= self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0,
            f"rotary_dim={self.rotary_dim} must be even and in [0, head_dim={self.head_dim}]",
        )
        require(
            self.softmax_scale is None or self.softmax_scale > 0,
            f"softmax_scale={self.softmax_scale} must be > 0",
        )

    @property
    def scale(self) -> float:
        """The factor of q k^T before the softmax."""
        return self.head_dim**-0.5 if self.softmax_scale is None else self.softmax_scale


@dataclasses.dataclass(frozen=True)
class Mamba2Config:
    """Mamba2 (SSD) mixer: in_proj -> [z | xBC | dt], conv(xBC), SSM, gated group norm, out_proj.

    `gate_norm` is how the SSM output y meets the gate z before out_proj, the norm an RMSNorm over
    groups of d_inner / n_groups channels with a weight of d_inner: "gate_then_norm"
    `norm(y * silu(z))` (Mamba2, NemotronH), "norm_then_gate" `norm(y) * silu(z)`, "gate_only"
    `y * silu(z)` with no norm (Falcon-H1 without `mamba_rms_norm`). `gate_norm_eps` is that
    norm's epsilon, None for the model's `norm_eps` (Zamba2 fixes it at 1e-5).
    """

    num_heads: int
    head_dim: int
    d_state: int
    n_groups: int
    d_conv: int
    chunk_size: int
    conv_bias: bool = True
    dt_limit: tuple[float, float] = (0.0, math.inf)
    gate_norm: str = "gate_then_norm"
    gate_norm_eps: float | None = None
    # The prefill scan kernel (`pallas_kernels.ssd.chunk_scan`): a property of the model, never of
    # the batch, so a request's prefill output does not depend on what shares its step.
    scan_algorithm: str = "sequential"
    # In the config of a tensor-parallel shard: how many shards one gated-norm group spans (more
    # than 1 when there are fewer groups than shards, `jmamba.sharding`); 1 in a whole model.
    norm_group_shards: int = 1

    def __post_init__(self) -> None:
        require(
            self.scan_algorithm in SCAN_ALGORITHMS,
            f"scan_algorithm={self.scan_algorithm!r} must be one of {SCAN_ALGORITHMS}",
        )
        require(
            self.num_heads % self.n_groups == 0,
            f"mamba num_heads={self.num_heads} must be a multiple of n_groups={self.n_groups}",
        )
        require(self.d_conv >= 2, f"conv kernel d_conv={self.d_conv} must be >= 2")
        require(
            self.gate_norm in GATE_NORMS,
            f"gate_norm={self.gate_norm!r} must be one of {GATE_NORMS}",
        )

    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.d_state


@dataclasses.dataclass(frozen=True)
class GDNConfig:
    """Gated DeltaNet mixer (Qwen3-Next / Qwen3.5 linear attention)."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    d_conv: int

    def __post_init__(self) -> None:
        require(
            self.num_v_heads % self.num_k_heads == 0,
            f"linear_num_value_heads={self.num_v_heads} must be a multiple of "
            f"linear_num_key_heads={self.num_k_heads}",
        )

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


@dataclasses.dataclass(frozen=True)
class MlpConfig:
    """Dense feed-forward: `silu_gated` is SwiGLU (gate, up, down); `relu2`: up, relu^2, down."""

    intermediate_size: int
    activation: str = "silu_gated"

    def __post_init__(self) -> None:
        require(
            self.activation in ("silu_gated", "relu2"),
            f"mlp activation={self.activation!r} must be 'silu_gated' or 'relu2'",
        )


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    """Routed experts plus a shared expert.

    `router="softmax"`: softmax over experts, top-k, optional renormalisation (Qwen).
    `router="sigmoid_grouped"`: sigmoid scores, a correction bias for selection only, group-limited
    top-k, renormalised uncorrected scores times `routed_scaling_factor` (NemotronH).
    """

    num_experts: int
    top_k: int
    intermediate_size: int
    shared_intermediate_size: int
    activation: str = "silu_gated"
    router: str = "softmax"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    shared_gate: bool = False

    def __post_init__(self) -> None:
        require(
            1 <= self.top_k <= self.num_experts,
            f"num_experts_per_tok={self.top_k} must be in [1, num_experts={self.num_experts}]",
        )
        require(
            self.router in ("softmax", "sigmoid_grouped"),
            f"router={self.router!r} must be 'softmax' or 'sigmoid_grouped'",
        )
        require(
            self.num_experts % self.n_group == 0 and 1 <= self.topk_group <= self.n_group,
            f"n_group={self.n_group} must divide num_experts={self.num_experts} and "
            f"topk_group={self.topk_group} must be in [1, n_group]",
        )


@dataclasses.dataclass(frozen=True)
class SharedBlockConfig:
    """The transformer block of a `Mixer.TRANSFORMER_MAMBA2` layer (Zamba2's shared block).

    Over the concatenation [x | embeddings] (2 x hidden wide): RMSNorm, attention
    (`ModelConfig.attention`, its output hidden wide), RMSNorm, a gated MLP whose gate and up
    projections are one [hidden, 2 x intermediate_size] kernel (`activation`: "gelu" or "silu" on
    the gate). The checkpoint holds `num_blocks` such blocks, the j-th TRANSFORMER_MAMBA2 layer
    using block j % num_blocks, with a rank-`adapter_rank` LoRA adapter of its own on gate | up
    and, when `attention_adapters`, on q, k and v; the loader folds each adapter into its layer's
    copy of the block (`jmamba.mixers.transformer_mamba2`).
    """

    num_blocks: int
    intermediate_size: int
    adapter_rank: int
    attention_adapters: bool
    activation: str = "gelu"

    def __post_init__(self) -> None:
        require(self.num_blocks >= 1, f"num_mem_blocks={self.num_blocks} must be >= 1")
        require(self.adapter_rank >= 1, f"adapter_rank={self.adapter_rank} must be >= 1")
        require(
            self.activation in ("gelu", "silu"),
            f"shared block activation={self.activation!r} must be 'gelu' or 'silu'",
        )
