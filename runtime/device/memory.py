"""What one device's memory holds: its parameter shard, one entry of each pool, and the
activations of a step, in bytes (`runtime.core.pool_memory.PoolMemory`, which sizes the KV pool
from them with `EngineArgs.gpu_memory_utilization`), and the one place an engine's args are
resolved for its model on these devices (`resolve_config`)."""

from __future__ import annotations

from jmamba.config import Ffn, Mixer, ModelConfig
from jmamba.model import HybridLM
from runtime.core.config import EngineConfig
from runtime.core.engine_args import EngineArgs
from runtime.core.pool_memory import PoolMemory
from runtime.device import footprint
from runtime.device.mtp_drafts import served_model
from runtime.device.placement import shard_model_shapes

FP32_BYTES = 4
LOGITS_COPIES = 2  # the fp32 logits and their softmax (or log-softmax) for sampling


def device_memory() -> int | None:
    """The first local device's memory limit in bytes; None where the device reports none (the
    CPU). Tests set it here."""
    return footprint.device_memory()


def resolve_config(model: HybridLM, args: EngineArgs) -> EngineConfig:
    """`args` resolved for `model` as an engine of them serves it (`served_model`), its KV pool
    sized from this process's first device when `args` ask for it (`pool_memory`)."""
    served = served_model(model, args.speculative_config)
    return args.for_model(served.config, pool_memory(served, args))


def pool_memory(model: HybridLM, args: EngineArgs) -> PoolMemory | None:
    """One device's bytes for `model` split over `args.tensor_parallel_size` shards, when
    `args` size the KV blocks from memory and the device reports its memory; else None."""
    if not args.sizes_blocks_from_memory:
        return None
    limit = device_memory()
    if limit is None:
        return None
    shard = shard_model_shapes(model, args.tensor_parallel_size, model.dtype)
    block, slot = footprint.entry_bytes(shard, args.block_size, args.cache_dtypes)
    return PoolMemory(
        device_bytes=limit,
        param_bytes=footprint.param_bytes(shard),
        block_bytes=block,
        slot_bytes=slot,
        token_bytes=activation_token_bytes(shard.config),
        logits_row_bytes=LOGITS_COPIES * FP32_BYTES * shard.config.vocab_per_shard,
    )


def activation_token_bytes(cfg: ModelConfig) -> int:
    """Activation bytes per token lane of a step on one device (`cfg`: one shard's config), as
    fp32: the residual stream and the normed layer input (2 x hidden) beside the widest layer's
    own intermediates (`layer_width`). Layers run one after the other, so only the widest counts;
    bf16 tensors are counted as fp32 (the estimate errs on the side of room)."""
    widths = [layer_width(cfg, mixer, ffn) for mixer, ffn in zip(cfg.mixers, cfg.ffns, strict=True)]
    return FP32_BYTES * (2 * cfg.hidden_size + max(widths))


def layer_width(cfg: ModelConfig, mixer: Mixer, ffn: Ffn) -> int:
    """Per-token values one layer's mixer or FFN holds at its peak on one shard (the larger):
    attention q (with its gate), k, v and the output; Mamba2 and Gated DeltaNet their input
    projection and output; an MLP gate, up and their product; a MoE layer each of its top-k
    choices' sorted input and fp32 output (2 x hidden) and expert gate, up and product (up and
    its square with relu^2), beside its shared expert's."""
    widths = {Mixer.NONE: 0, Ffn.NONE: 0}
    if cfg.attention is not None:
        a = cfg.attention
        q = a.num_heads * a.head_dim * (2 if a.output_gate else 1)
        widths[Mixer.ATTENTION] = q + (2 * a.num_kv_heads + a.num_heads) * a.head_dim
    if cfg.mamba2 is not None:
        m = cfg.mamba2
        in_proj = 2 * m.d_inner + 2 * m.n_groups * m.d_state + m.num_heads
        widths[Mixer.MAMBA2] = in_proj + m.d_inner
    if cfg.gdn is not None:
        g = cfg.gdn
        widths[Mixer.GDN] = 2 * g.key_dim + 3 * g.value_dim + 2 * g.num_v_heads
    if cfg.mlp is not None:
        widths[Ffn.MLP] = (
            3 if cfg.mlp.activation == "silu_gated" else 2
        ) * cfg.mlp.intermediate_size
    if cfg.moe is not None:
        moe = cfg.moe
        products = 3 if moe.activation == "silu_gated" else 2  # gate, up, product or up, relu^2
        per_choice = 2 * cfg.hidden_size + products * moe.intermediate_size
        widths[Ffn.MOE] = moe.top_k * per_choice + products * moe.shared_intermediate_size
    both = widths.get(Mixer.ATTENTION, 0) + widths.get(Mixer.MAMBA2, 0)
    widths[Mixer.PARALLEL_HYBRID] = both
    shared = cfg.shared_block
    widths[Mixer.TRANSFORMER_MAMBA2] = both + (
        0 if shared is None else 3 * shared.intermediate_size
    )
    return max(widths[mixer], widths[ffn])
