"""`Layer`: one layer of a hybrid model, an optional token mixer and an optional feed-forward
block, each pre-normed with a residual connection (`HybridLM`'s stack and the MTP head's are made
of them).

Every layer also gets the token embeddings, which only a mixer kind that reads them uses
(`Mixer.reads_embeddings`: Zamba2's transformer block over [x | embeddings]). In a
tensor-parallel shard the mixer and the FFN each return this shard's partial output, summed over
the shards by one all-reduce each (`TensorParallel`, the identity in a whole model).
"""

from __future__ import annotations

import jax
from flax import nnx

from jmamba.config import Ffn, Mixer, ModelConfig
from jmamba.layers.mlp import MLP
from jmamba.layers.moe import MoE
from jmamba.layers.norms import RMSNorm
from jmamba.mixers.attention import Attention, KVCache
from jmamba.mixers.gated_deltanet import GatedDeltaNet, GDNState
from jmamba.mixers.mamba2 import Mamba2, Mamba2State
from jmamba.mixers.parallel_hybrid import ParallelHybrid, ParallelHybridCache
from jmamba.mixers.transformer_mamba2 import TransformerMamba2
from jmamba.parallel.collectives import TensorParallel
from jmamba.step.pytree import StepInputs

LayerCache = KVCache | Mamba2State | GDNState | ParallelHybridCache | None


def _make_mixer(
    config: ModelConfig, kind: Mixer, rngs: nnx.Rngs, tp: TensorParallel
) -> nnx.Module | None:
    hidden, eps = config.hidden_size, config.norm_eps
    match kind:
        case Mixer.ATTENTION:
            return Attention(hidden, config.need_attention(), eps, config.norm_offset, rngs=rngs)
        case Mixer.MAMBA2:
            return Mamba2(hidden, config.need_mamba2(), eps, rngs=rngs, tp=tp)
        case Mixer.GDN:
            return GatedDeltaNet(hidden, config.need_gdn(), eps, rngs=rngs)
        case Mixer.PARALLEL_HYBRID:
            attention, mamba2 = config.need_attention(), config.need_mamba2()
            return ParallelHybrid(
                hidden, attention, mamba2, eps, config.norm_offset, rngs=rngs, tp=tp
            )
        case Mixer.TRANSFORMER_MAMBA2:
            attention, mamba2 = config.need_attention(), config.need_mamba2()
            block = config.need_shared_block()
            return TransformerMamba2(hidden, attention, mamba2, block, eps, rngs=rngs)
        case Mixer.NONE:
            return None


def _make_ffn(
    config: ModelConfig, kind: Ffn, rngs: nnx.Rngs, tp: TensorParallel
) -> nnx.Module | None:
    match kind:
        case Ffn.MLP:
            mlp = config.need_mlp()
            return MLP(config.hidden_size, mlp.intermediate_size, mlp.activation, rngs=rngs)
        case Ffn.MOE:
            return MoE(config.hidden_size, config.need_moe(), rngs=rngs, tp=tp)
        case Ffn.NONE:
            return None


class Layer(nnx.Module):
    """`x += r * mixer(norm(x))`, then `x += r * ffn(norm(x))`, each part present or not; r is
    `ModelConfig.residual_multiplier` (1.0 but in Granite). A mixer that reads the embeddings
    (`Mixer.reads_embeddings`) gets x itself and the embeddings, and norms its inputs itself. In a
    tensor-parallel shard the mixer and the FFN each return this shard's partial output (their
    last projection is row-parallel), summed over the shards by one all-reduce each."""

    def __init__(self, config: ModelConfig, mixer: Mixer, ffn: Ffn, *, rngs: nnx.Rngs):
        norm = lambda: RMSNorm(config.hidden_size, config.norm_eps, config.norm_offset)  # noqa: E731
        self.tp = TensorParallel(config.num_shards)
        self.residual_multiplier = config.residual_multiplier
        has_norm = mixer != Mixer.NONE and not mixer.reads_embeddings
        self.mixer_norm = norm() if has_norm else None
        self.mixer = _make_mixer(config, mixer, rngs, self.tp)
        self.ffn_norm = norm() if ffn != Ffn.NONE else None
        self.ffn = _make_ffn(config, ffn, rngs, self.tp)

    def __call__(
        self, x: jax.Array, cache: LayerCache, inputs: StepInputs, embeddings: jax.Array
    ) -> tuple[jax.Array, LayerCache]:
        """x and embeddings [T, hidden] (the embeddings as the first layer got them)."""
        # Named scopes tag every HLO op with its part, so a profile splits the step's device time
        # by part (benchmarks/engine/profile_step.py); they cost nothing at run time.
        if self.mixer is not None:
            with jax.named_scope(f"mixer_{type(self.mixer).__name__}"):
                if self.mixer_norm is None:  # `Mixer.reads_embeddings`: it norms its own inputs
                    y, cache = self.mixer(x, embeddings, cache, inputs)
                else:
                    y, cache = self.mixer(self.mixer_norm(x), cache, inputs)
            x = x + self.tp.all_reduce(y) * self.residual_multiplier
        if self.ffn is not None and self.ffn_norm is not None:  # both or neither
            with jax.named_scope(f"ffn_{type(self.ffn).__name__}"):
                x = x + self.tp.all_reduce(self.ffn(self.ffn_norm(x))) * self.residual_multiplier
        return x, cache
