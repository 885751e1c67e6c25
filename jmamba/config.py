"""Model configuration: the hybrid pattern as data, beside one config per layer kind in use.

A model is a stack of layers; each layer is an optional token mixer (attention, Mamba2, Gated
DeltaNet, attention and Mamba2 side by side, or a transformer block feeding a Mamba2 mixer) and an
optional feed-forward block (dense MLP or MoE), each pre-normed with a residual.
`jmamba.checkpoints.families.registry` turns a Hugging Face `config.json` into a `ModelConfig`.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from jmamba.fp8_plan import NO_FP8, Fp8Plan
from jmamba.layer_configs import (
    GDN_CHUNK_SIZE,
    AttentionConfig,
    GDNConfig,
    Mamba2Config,
    MlpConfig,
    MoeConfig,
    SharedBlockConfig,
    require,
)
from jmamba.multipliers import WeightMultipliers


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


def _needed[T](value: T | None, name: str, architecture: str) -> T:
    if value is None:
        raise ValueError(f"{architecture}: a layer reads ModelConfig.{name}, which is missing")
    return value


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
    # Which linear layers hold FP8 kernels (`jmamba.fp8_plan`; the loader sets it).
    quantization: Fp8Plan = NO_FP8

    def __post_init__(self) -> None:
        require(
            self.vocab_size > 0 and self.hidden_size > 0,
            f"vocab_size={self.vocab_size} and hidden_size={self.hidden_size} must be > 0",
        )
        require(
            len(self.mixers) == len(self.ffns) and len(self.mixers) > 0,
            f"layer pattern needs one mixer and one ffn per layer, got {len(self.mixers)} "
            f"and {len(self.ffns)}",
        )
        outside = [i for i in self.eos_token_ids if not 0 <= i < self.vocab_size]
        require(
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
        require(
            len(self.mtp_mixers) == len(self.mtp_ffns),
            f"MTP pattern needs one mixer and one ffn per layer, got {len(self.mtp_mixers)} "
            f"and {len(self.mtp_ffns)}",
        )
        require(
            set(self.mtp_mixers) <= {Mixer.ATTENTION, Mixer.NONE},
            f"MTP mixers {[m.value for m in self.mtp_mixers]} must be attention or none",
        )
        kinds = {*self.mixers, *self.ffns, *self.mtp_mixers, *self.mtp_ffns}
        for kind in kinds:
            for name in needs.get(kind, ()):
                require(
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
