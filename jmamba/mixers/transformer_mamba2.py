"""A transformer block over [x | embeddings] whose output joins a Mamba2 mixer's input (Zamba2's
hybrid layer, `Mixer.TRANSFORMER_MAMBA2`).

With x the residual stream entering the layer and e the token embeddings of the first layer:

    h = norm_2H([x | e])                       (RMSNorm over 2 x hidden)
    a = attention(h)                           (q, k, v from 2H, o_proj back to hidden)
    t = linear(mlp(norm(a)))                   (gated MLP, gate | up in one kernel; no residual)
    y = mamba2(norm(x + t))                    (the layer adds y to x: x + y)

The block has no residual of its own, and t reaches the residual stream only through the Mamba2
mixer's input; so the mixer norms its own inputs and reads the embeddings (`Mixer.reads_embeddings`:
`jmamba.model.Layer` hands it x and e instead of a normed x). Its state is the attention's KV
blocks and the Mamba2 state slot (`ParallelHybridCache`: the same two states as Falcon-H1's
layer); each use site of a shared block keeps KV blocks of its own, as transformers' cache does.

Shared weights, folded per use site. A Zamba2 checkpoint holds `num_mem_blocks` transformer blocks
(`jmamba.layer_configs.SharedBlockConfig`); the j-th hybrid layer uses block j % num_mem_blocks,
plus its own rank-r LoRA adapters on the block's gate | up kernel and
(`use_shared_attention_adapter`) on q, k and v. The loader gives every use site its own copy of the
block with its adapters folded in, `W + B A` (`jmamba.checkpoints.folding.lora_fold`, in float64
rounded once to fp32: the folded and the unfolded products agree within the 1e-4 parity), so the
step runs plain attention and MLP kernels and the model shares no weight at run time: no shared
module in the NNX graph, no LoRA matmuls in the step, each layer a tree of its own parameters like
every other kind. The cost is memory. A block is 14 H^2 + 3 H I parameters (q, k, v 2H x 2H each, o
2H x H, gate | up H x 2I, down I x H); for the published configs (H, I, use sites / blocks) that is:

    Zamba2-1.2B (2048,  8192,  6 / 1): 109 M per block, 5 extra copies:  0.55 B params, 1.1 GB bf16
    Zamba2-2.7B (2560, 10240,  9 / 2): 170 M per block, 7 extra copies:  1.19 B params, 2.4 GB bf16
    Zamba2-7B   (3584, 14336, 13 / 2): 334 M per block, 11 extra copies: 3.67 B params, 7.3 GB bf16

(about 45-50% more weight memory). A decode step reads the same bytes either way: each use site
reads its whole block, far more than an L2 cache keeps between sites. Sharing the block in the NNX
graph and running the adapters unfolded would save that memory for about 6% more block FLOPs
(r / H); we chose plain per-layer parameters because the loader, `cast`, the writer and tensor
parallelism then treat this kind like every other.

The adapters are kept beside their kernels (`LoraFactors`, zero for a fresh model; per site r (H +
2I), plus 12 r H with attention adapters: 33 M parameters for the 1.2B with them, 27 M for the 2.7B
without, 54 M or 125 M for the 7B without or with), never read by the step, so that
`save_pretrained` writes the checkpoint back: each adapter as loaded, and each shared kernel as the
one tensor W whose fold with every use site's adapter gives that site's parameter bit for bit
(`jmamba.checkpoints.folding.lora_unfold`). That W is the checkpoint's own unless several tensors
fold to the same parameters (where |B A| >> |W| the fold rounds away W's last bits); the writer then
picks another of them, so a written model reloads to the same parameters but its shared kernel may
differ from the checkpoint's in those bits (by at most one step of the parameter's dtype).
Parameters that are not the fold of one W (a fresh model, one changed after loading, or one cast to
bf16 after loading in fp32, whose adapters are rounded after the fold) cannot all come back: the
writer writes the W nearest to the first use site's parameter minus its adapter, which reads back as
that parameter or within a step or two of it, and the block's later use sites come back as that W
with their own adapters folded in. The other shared tensors (norms, o_proj, down_proj) are copied
unchanged and written from the first use site.

Tensor parallelism (not built yet; one all-reduce per part, three per layer): the attention splits
q_proj's columns by query head, k_proj's and v_proj's by KV head (replicated where there are fewer
than `tp`; with attention adapters there are as many as query heads) and o_proj's rows by head,
the KV cache its kv-heads axis; the MLP splits gate_up's columns by
intermediate channel, gate and up alike (the kernel viewed as [H, 2, I], its last axis split) and
down_proj's rows the same way. The 2H norm, `linear` [H, H] and the mamba norm act on the replicated
residual stream and stay replicated, as do the LoRA factors (or they stay on the host: the step
never reads them). The Mamba2 mixer shards as in `jmamba.mixers.parallel_hybrid`.

transformers clamps dt to (time_step_min, inf) in prefill only, we in decode too; the two differ
only where softplus(dt + dt_bias) < time_step_min (1e-3) in a decode step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jmamba.layer_configs import AttentionConfig, Mamba2Config, SharedBlockConfig
from jmamba.layers.linear import Linear
from jmamba.layers.lora import LoraFactors
from jmamba.layers.mlp import GateUpMLP
from jmamba.layers.norms import RMSNorm
from jmamba.mixers.attention import Attention
from jmamba.mixers.mamba2 import Mamba2
from jmamba.mixers.parallel_hybrid import ParallelHybridCache
from jmamba.step.pytree import StepInputs


class TransformerMamba2(nnx.Module):
    """`(x, embeddings, cache, inputs) -> (y, new cache)`, x and embeddings [T, hidden], y
    [T, hidden] to add to x; see the module docstring."""

    def __init__(
        self,
        hidden: int,
        attention: AttentionConfig,
        mamba2: Mamba2Config,
        block: SharedBlockConfig,
        norm_eps: float,
        *,
        rngs: nnx.Rngs,
    ):
        self.block_norm = RMSNorm(2 * hidden, norm_eps)
        self.attention = Attention(
            2 * hidden, attention, norm_eps, 0.0, rngs=rngs, out_features=hidden
        )
        self.ffn_norm = RMSNorm(hidden, norm_eps)
        self.mlp = GateUpMLP(hidden, block.intermediate_size, block.activation, rngs=rngs)
        self.linear = Linear(hidden, hidden, rngs=rngs)
        self.mamba_norm = RMSNorm(hidden, norm_eps)
        self.mamba2 = Mamba2(hidden, mamba2, norm_eps, rngs=rngs)
        rank, q_width = block.adapter_rank, attention.num_heads * attention.head_dim
        kv_width = attention.num_kv_heads * attention.head_dim
        self.gate_up_adapter = LoraFactors(hidden, 2 * block.intermediate_size, rank)
        if block.attention_adapters:
            self.q_adapter = LoraFactors(2 * hidden, q_width, rank)
            self.k_adapter = LoraFactors(2 * hidden, kv_width, rank)
            self.v_adapter = LoraFactors(2 * hidden, kv_width, rank)

    def __call__(
        self, x: jax.Array, embeddings: jax.Array, cache: ParallelHybridCache, inputs: StepInputs
    ) -> tuple[jax.Array, ParallelHybridCache]:
        with jax.named_scope("block"):
            h = self.block_norm(jnp.concatenate([x, embeddings.astype(x.dtype)], axis=-1))
            a, kv = self.attention(h, cache.kv, inputs)
            t = self.linear(self.mlp(self.ffn_norm(a)))
        with jax.named_scope("mamba2"):
            y, state = self.mamba2(self.mamba_norm(x + t), cache.state, inputs)
        return y, ParallelHybridCache(kv, state)
