"""Model configuration: one frozen dataclass per layer kind, the hybrid pattern as data.

A model is a stack of layers; each layer is an optional token mixer (attention, Mamba2 or Gated
DeltaNet) and an optional feed-forward block (dense MLP or MoE), each pre-normed with a residual.
`jmamba.families` turns a Hugging Face `config.json` into a `ModelConfig`.
"""

from __future__ import annotations

import dataclasses
import enum
import math

GDN_CHUNK_SIZE = 64  # the Gated DeltaNet prefill chunk (fixed in every reference implementation)
SCAN_ALGORITHMS = ("sequential", "parallel")  # the Mamba2 prefill scan kernels


class Mixer(enum.StrEnum):
    """The token mixer of a layer."""

    NONE = "none"
    ATTENTION = "attention"
    MAMBA2 = "mamba2"
    GDN = "gdn"


class Ffn(enum.StrEnum):
    """The feed-forward block of a layer."""

    NONE = "none"
    MLP = "mlp"
    MOE = "moe"


def _require(condition: bool, message: str) -> None:
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
        _require(
            self.num_heads % self.num_kv_heads == 0,
            f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}",
        )
        _require(
            0 <= self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0,
            f"rotary_dim={self.rotary_dim} must be even and in [0, head_dim={self.head_dim}]",
        )
        _require(
            self.softmax_scale is None or self.softmax_scale > 0,
            f"softmax_scale={self.softmax_scale} must be > 0",
        )

    @property
    def scale(self) -> float:
        """The factor of q k^T before the softmax."""
        return self.head_dim**-0.5 if self.softmax_scale is None else self.softmax_scale


@dataclasses.dataclass(frozen=True)
class Mamba2Config:
    """Mamba2 (SSD) mixer: in_proj -> [z | xBC | dt], conv(xBC), SSM, gated group norm, out_proj."""

    num_heads: int
    head_dim: int
    d_state: int
    n_groups: int
    d_conv: int
    chunk_size: int
    conv_bias: bool = True
    dt_limit: tuple[float, float] = (0.0, math.inf)
    # The prefill scan kernel (`pallas_kernels.ssd.chunk_scan`): a property of the model, never of
    # the batch, so a request's prefill output does not depend on what shares its step.
    scan_algorithm: str = "sequential"

    def __post_init__(self) -> None:
        _require(
            self.scan_algorithm in SCAN_ALGORITHMS,
            f"scan_algorithm={self.scan_algorithm!r} must be one of {SCAN_ALGORITHMS}",
        )
        _require(
            self.num_heads % self.n_groups == 0,
            f"mamba num_heads={self.num_heads} must be a multiple of n_groups={self.n_groups}",
        )
        _require(self.d_conv >= 2, f"conv kernel d_conv={self.d_conv} must be >= 2")

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
        _require(
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
        _require(
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
        _require(
            1 <= self.top_k <= self.num_experts,
            f"num_experts_per_tok={self.top_k} must be in [1, num_experts={self.num_experts}]",
        )
        _require(
            self.router in ("softmax", "sigmoid_grouped"),
            f"router={self.router!r} must be 'softmax' or 'sigmoid_grouped'",
        )
        _require(
            self.num_experts % self.n_group == 0 and 1 <= self.topk_group <= self.n_group,
            f"n_group={self.n_group} must divide num_experts={self.num_experts} and "
            f"topk_group={self.topk_group} must be in [1, n_group]",
        )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A hybrid language model: the per-layer pattern plus one config per layer kind in use.

    `norm_offset` is 1.0 for zero-centred RMSNorms (`x_hat * (1 + w)`, Qwen3-Next) and 0.0 for plain
    ones. `architecture` is the HF class name the config came from (it picks the weight names).
    `eos_token_ids` end generation (unless a request ignores EOS): those of config.json and of
    generation_config.json when the checkpoint has one.

    Three constant multipliers (Granite's muP-style scales; 1.0 in the other families, where they
    change nothing): `embedding_multiplier` scales the embedding rows before the first layer,
    `residual_multiplier` each mixer's and FFN's output before its residual add, and
    `logits_multiplier` the logits (Granite: 1 / `logits_scaling`). They are fields rather than
    factors folded into the weights because folding is not exactly invertible: `save_pretrained`
    must give the checkpoint's tensors back bit for bit, and with tied embeddings one table serves
    as both the embedding and the LM head. Under tensor parallelism each is the same scalar on
    every shard (scaling commutes with the shards' all-reduce or gather).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    mixers: tuple[Mixer, ...]
    ffns: tuple[Ffn, ...]
    norm_eps: float = 1e-5
    norm_offset: float = 0.0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    eos_token_ids: tuple[int, ...] = ()
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_multiplier: float = 1.0
    attention: AttentionConfig | None = None
    mamba2: Mamba2Config | None = None
    gdn: GDNConfig | None = None
    mlp: MlpConfig | None = None
    moe: MoeConfig | None = None

    def __post_init__(self) -> None:
        _require(
            self.vocab_size > 0 and self.hidden_size > 0,
            f"vocab_size={self.vocab_size} and hidden_size={self.hidden_size} must be > 0",
        )
        _require(
            len(self.mixers) == len(self.ffns) and len(self.mixers) > 0,
            f"layer pattern needs one mixer and one ffn per layer, got {len(self.mixers)} "
            f"and {len(self.ffns)}",
        )
        outside = [i for i in self.eos_token_ids if not 0 <= i < self.vocab_size]
        _require(
            not outside,
            f"eos_token_ids {outside} are outside the vocabulary [0, {self.vocab_size})",
        )
        needs = {
            Mixer.ATTENTION: "attention",
            Mixer.MAMBA2: "mamba2",
            Mixer.GDN: "gdn",
            Ffn.MLP: "mlp",
            Ffn.MOE: "moe",
        }
        for kind in set(self.mixers) | set(self.ffns):
            if kind in needs:
                _require(
                    getattr(self, needs[kind]) is not None,
                    f"layer kind {kind.value!r} is used but the {needs[kind]} config is missing",
                )

    @property
    def num_layers(self) -> int:
        return len(self.mixers)

    @property
    def has_attention(self) -> bool:
        return Mixer.ATTENTION in self.mixers

    @property
    def has_recurrent_state(self) -> bool:
        return Mixer.MAMBA2 in self.mixers or Mixer.GDN in self.mixers

    @property
    def chunk_size(self) -> int:
        """Prefill chunks must end on absolute multiples of this (the recurrent kernels' chunk)."""
        sizes = [1]
        if Mixer.MAMBA2 in self.mixers:
            sizes.append(self.mamba2.chunk_size)
        if Mixer.GDN in self.mixers:
            sizes.append(GDN_CHUNK_SIZE)
        return math.lcm(*sizes)
