"""Model configuration: one frozen dataclass per layer kind, the hybrid pattern as data.

A model is a stack of layers; each layer is an optional token mixer (attention, Mamba2, Gated
DeltaNet, attention and Mamba2 side by side, or a transformer block feeding a Mamba2 mixer) and an
optional feed-forward block (dense MLP or MoE), each pre-normed with a residual.
`jmamba.checkpoints.families.registry` turns a Hugging Face `config.json` into a `ModelConfig`.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from jmamba.multipliers import WeightMultipliers

GDN_CHUNK_SIZE = 64  # the Gated DeltaNet prefill chunk (fixed in every reference implementation)
SCAN_ALGORITHMS = ("sequential", "parallel")  # the Mamba2 prefill scan kernels
# How the Mamba2 output y meets its gate z (`Mamba2Config.gate_norm`).
GATE_NORMS = ("gate_then_norm", "norm_then_gate", "gate_only")


class Mixer(enum.StrEnum):
    """The token mixer of a layer."""

    NONE = "none"
    ATTENTION = "attention"
    MAMBA2 = "mamba2"
    GDN = "gdn"
    PARALLEL_HYBRID = "parallel_hybrid"  # attention and Mamba2 on the same input, outputs summed
    TRANSFORMER_MAMBA2 = "transformer_mamba2"  # Zamba2's: a transformer block feeding Mamba2

    @property
    def uses_kv_cache(self) -> bool:
        """Whether a layer of this kind keeps KV blocks."""
        return self in (Mixer.ATTENTION, Mixer.PARALLEL_HYBRID, Mixer.TRANSFORMER_MAMBA2)

    @property
    def uses_state(self) -> bool:
        """Whether a layer of this kind keeps a recurrent state in a slot."""
        return self in (Mixer.MAMBA2, Mixer.GDN, Mixer.PARALLEL_HYBRID, Mixer.TRANSFORMER_MAMBA2)

    @property
    def uses_mamba2(self) -> bool:
        """Whether a layer of this kind runs a Mamba2 mixer (and so its prefill chunks)."""
        return self in (Mixer.MAMBA2, Mixer.PARALLEL_HYBRID, Mixer.TRANSFORMER_MAMBA2)

    @property
    def reads_embeddings(self) -> bool:
        """Whether the mixer takes the un-normed residual stream and the token embeddings (and
        norms its inputs itself) instead of the layer's normed input."""
        return self == Mixer.TRANSFORMER_MAMBA2


class Ffn(enum.StrEnum):
    """The feed-forward block of a layer."""

    NONE = "none"
    MLP = "mlp"
    MOE = "moe"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _needed[T](value: T | None, name: str, architecture: str) -> T:
    if value is None:
        raise ValueError(f"{architecture}: a layer reads ModelConfig.{name}, which is missing")
    return value


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
        _require(
            self.scan_algorithm in SCAN_ALGORITHMS,
            f"scan_algorithm={self.scan_algorithm!r} must be one of {SCAN_ALGORITHMS}",
        )
        _require(
            self.num_heads % self.n_groups == 0,
            f"mamba num_heads={self.num_heads} must be a multiple of n_groups={self.n_groups}",
        )
        _require(self.d_conv >= 2, f"conv kernel d_conv={self.d_conv} must be >= 2")
        _require(
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
        _require(self.num_blocks >= 1, f"num_mem_blocks={self.num_blocks} must be >= 1")
        _require(self.adapter_rank >= 1, f"adapter_rank={self.adapter_rank} must be >= 1")
        _require(
            self.activation in ("gelu", "silu"),
            f"shared block activation={self.activation!r} must be 'gelu' or 'silu'",
        )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A hybrid language model: the per-layer pattern plus one config per layer kind in use.

    `norm_offset` is 1.0 for zero-centred RMSNorms (`x_hat * (1 + w)`, Qwen3-Next) and 0.0 for plain
    ones. `architecture` is the HF class name the config came from (it picks the weight names).
    `eos_token_ids` end generation (unless a request ignores EOS): those of config.json and of
    generation_config.json when the checkpoint has one.

    Constant multipliers (muP-style scales of Granite-4.0-H and Falcon-H1; 1.0 elsewhere) come in
    two kinds. Those at the model's boundaries are fields the step applies: `embedding_multiplier`
    scales the embedding rows before the first layer, `residual_multiplier` each mixer's and FFN's
    output before its residual add, `logits_multiplier` the logits (Granite: 1 / `logits_scaling`;
    Falcon-H1: `lm_head_multiplier`). They stay fields because a tied head is the embedding table
    itself, so neither scale can live in it. Those inside a layer's linear maps are `multipliers`,
    folded into the weights at load time (`jmamba.checkpoints.folding`). Under tensor parallelism
    each is the same scalar on every shard (scaling commutes with the shards' all-reduce or gather).
    One config per layer kind in use (`__post_init__`'s `needs` says which kind reads which); a
    layer reads its own through `need_attention()`, ... (a ValueError naming a missing field).
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
    shared_block: SharedBlockConfig | None = None
    multipliers: WeightMultipliers = WeightMultipliers()
    # The multi-token-prediction head's layers (`jmamba.mtp`), a pattern like the model's own;
    # empty for a model without one. Its mixers are attention or none (they keep KV blocks).
    mtp_mixers: tuple[Mixer, ...] = ()
    mtp_ffns: tuple[Ffn, ...] = ()
    # The tensor-parallel shards this config is one of (`jmamba.sharding.shard_config`: its layer
    # configs hold one shard's heads, groups and channels); 1 is a whole model.
    num_shards: int = 1

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
            Mixer.ATTENTION: ("attention",),
            Mixer.MAMBA2: ("mamba2",),
            Mixer.GDN: ("gdn",),
            Mixer.PARALLEL_HYBRID: ("attention", "mamba2"),
            Mixer.TRANSFORMER_MAMBA2: ("attention", "mamba2", "shared_block"),
            Ffn.MLP: ("mlp",),
            Ffn.MOE: ("moe",),
        }
        _require(
            len(self.mtp_mixers) == len(self.mtp_ffns),
            f"MTP pattern needs one mixer and one ffn per layer, got {len(self.mtp_mixers)} "
            f"and {len(self.mtp_ffns)}",
        )
        _require(
            set(self.mtp_mixers) <= {Mixer.ATTENTION, Mixer.NONE},
            f"MTP mixers {[m.value for m in self.mtp_mixers]} must be attention or none",
        )
        kinds = {*self.mixers, *self.ffns, *self.mtp_mixers, *self.mtp_ffns}
        for kind in kinds:
            for name in needs.get(kind, ()):
                _require(
                    getattr(self, name) is not None,
                    f"layer kind {kind.value!r} is used but the {name} config is missing",
                )

    def need_attention(self) -> AttentionConfig:
        return _needed(self.attention, "attention", self.architecture)

    def need_mamba2(self) -> Mamba2Config:
        return _needed(self.mamba2, "mamba2", self.architecture)

    def need_gdn(self) -> GDNConfig:
        return _needed(self.gdn, "gdn", self.architecture)

    def need_mlp(self) -> MlpConfig:
        return _needed(self.mlp, "mlp", self.architecture)

    def need_moe(self) -> MoeConfig:
        return _needed(self.moe, "moe", self.architecture)

    def need_shared_block(self) -> SharedBlockConfig:
        return _needed(self.shared_block, "shared_block", self.architecture)

    @property
    def num_layers(self) -> int:
        return len(self.mixers)

    @property
    def vocab_per_shard(self) -> int:
        """Embedding rows (and logits) of one shard: the vocabulary split over `num_shards`, the
        last shard's rows padded with zeros."""
        return -(-self.vocab_size // self.num_shards)

    @property
    def has_attention(self) -> bool:
        """Whether any layer keeps KV blocks (the MTP head's included)."""
        return any(kind.uses_kv_cache for kind in (*self.mixers, *self.mtp_mixers))

    @property
    def has_mtp(self) -> bool:
        """Whether the model has a multi-token-prediction head (`jmamba.mtp`)."""
        return bool(self.mtp_mixers)

    @property
    def has_recurrent_state(self) -> bool:
        return any(kind.uses_state for kind in self.mixers)

    @property
    def chunk_size(self) -> int:
        """Prefill chunks must end on absolute multiples of this (the recurrent kernels' chunk)."""
        sizes = [1]
        if any(kind.uses_mamba2 for kind in self.mixers):
            sizes.append(self.need_mamba2().chunk_size)
        if Mixer.GDN in self.mixers:
            sizes.append(GDN_CHUNK_SIZE)
        return math.lcm(*sizes)
