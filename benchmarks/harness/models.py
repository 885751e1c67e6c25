"""The random bench models (bf16 weights, fp32 recurrent state): `1b`, NemotronH-shaped, ~0.87B
parameters; `qwen3next`, Qwen3-Next-80B-A3B's per-layer shapes on 12 layers; each with a `tiny` CPU
twin."""

from __future__ import annotations

import dataclasses
import time

import jax
from flax import nnx

from jmamba import HybridLM
from jmamba.checkpoints.families.registry import from_hf_config
from jmamba.checkpoints.weights import cast
from jmamba.config import Ffn, Mixer, ModelConfig
from runtime.device.distributed import DeviceMesh
from runtime.device.placement import ParamSource, PlacedParams, RandomShards, place_params

SIZES = ("tiny", "1b", "qwen3next_tiny", "qwen3next")
MAX_POSITIONS = 65536
_MAMBA, _MLP, _ATTN = "mamba", "mlp", "attention"
_GDN, _FULL = "linear_attention", "full_attention"


def hf_config(size: str) -> dict:
    """config.json of a bench model (see the module docstring)."""
    if size.startswith("qwen3next"):
        return _qwen3_next_config(tiny=size.endswith("tiny"))
    if size == "tiny":
        dims = dict(
            hidden_size=64,
            vocab_size=256,
            mamba_num_heads=8,
            mamba_head_dim=16,
            ssm_state_size=16,
            n_groups=2,
            chunk_size=16,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
        )
        pattern = [_MAMBA, _MLP, _ATTN, _MLP]
    else:
        dims = dict(
            hidden_size=2048,
            vocab_size=32000,
            mamba_num_heads=64,
            mamba_head_dim=64,
            ssm_state_size=128,
            n_groups=8,
            chunk_size=128,
            intermediate_size=8192,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=128,
        )
        pattern = [_MAMBA, _MLP] * 5 + [_ATTN, _MLP] + [_MAMBA, _MLP] * 5 + [_ATTN, _MLP]
        pattern = pattern[:22] + [_MAMBA, _MLP]
    return dict(
        architectures=["NemotronHForCausalLM"],
        layers_block_type=pattern,
        conv_kernel=4,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        **dims,
    )


def _qwen3_next_config(tiny: bool) -> dict:
    """Qwen3-Next-80B-A3B's per-layer shapes on 12 layers (tiny: the same structure, small)."""
    if tiny:
        dims = dict(
            hidden_size=64,
            vocab_size=256,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        )
        layers = [_GDN, _GDN, _GDN, _FULL]
    else:
        dims = dict(
            hidden_size=2048,
            vocab_size=151936,
            linear_num_key_heads=16,
            linear_num_value_heads=32,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            num_attention_heads=16,
            num_key_value_heads=2,
            head_dim=256,
            num_experts=512,
            num_experts_per_tok=10,
            moe_intermediate_size=512,
            shared_expert_intermediate_size=512,
        )
        layers = [_GDN, _GDN, _GDN, _FULL] * 3
    return dict(
        architectures=["Qwen3NextForCausalLM"],
        layer_types=layers,
        num_hidden_layers=len(layers),
        linear_conv_kernel_dim=4,
        intermediate_size=5120,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        max_position_embeddings=MAX_POSITIONS,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
        tie_word_embeddings=False,
        **dims,
    )


def build_model(size: str, *, mtp: bool = False, num_layers: int | None = None) -> HybridLM:
    """The random bench model in bf16 (`jmamba.checkpoints.weights.cast`), initialised inside one
    jitted call so
    the fp32 initial values of a 20B model never all exist at once. `mtp`: with a random MTP head
    of an attention block and an MLP block (NemotronH's kind; the head's weights are drawn after
    the model's, so the model is the one without it). `num_layers` (Qwen3-Next shapes): the first
    layers of its pattern only, for checks that need its shapes but not its depth."""
    fields = hf_config(size)
    if num_layers is not None:
        fields |= dict(layer_types=fields["layer_types"][:num_layers], num_hidden_layers=num_layers)
    config = from_hf_config(fields)
    if mtp:
        config = dataclasses.replace(
            config, mtp_mixers=(Mixer.ATTENTION, Mixer.NONE), mtp_ffns=(Ffn.NONE, Ffn.MLP)
        )
    graphdef, _ = nnx.split(shapes_of(config))
    state = jax.jit(lambda: nnx.split(_bf16_model(config))[1])()
    return nnx.merge(graphdef, state)


def _bf16_model(config: ModelConfig) -> HybridLM:
    return cast(HybridLM(config, rngs=nnx.Rngs(0)), "bfloat16")


def shapes_of(config: ModelConfig) -> HybridLM:
    """The bf16 model of `config` as shapes only (`nnx.eval_shape`): no values are made."""
    return nnx.eval_shape(lambda: _bf16_model(config))


class SharedParams:
    """A `ParamSource` that makes the parameters once (`RandomShards`) and hands the same arrays
    to every runner on that mesh: the runners of a bench's rows share one copy."""

    def __init__(self, source: RandomShards) -> None:
        self.source, self.placed, self.seconds = source, None, 0.0

    def __call__(self, model: HybridLM, mesh: DeviceMesh) -> PlacedParams:
        if self.placed is None:
            start = time.perf_counter()
            self.placed = self.source(model, mesh)
            jax.block_until_ready(self.placed.leaves)
            self.seconds = time.perf_counter() - start
        return self.placed


# Sizes whose weights are drawn on the device by default: a runner's placement copies a model
# already on the device, and the Qwen3-Next shape's 41 GB twice does not fit an 80 GB H100.
DRAWN = ("qwen3next",)


def bench_model(size: str, drawn: bool | None = None) -> tuple[HybridLM, ParamSource]:
    """The bench model and where a runner gets its parameters. `drawn` (None: `size in DRAWN`):
    the model as shapes and its weights drawn on the device, once for every runner
    (`SharedParams`); else the model built whole (`build_model`) and placed by each runner."""
    if drawn is None:
        drawn = size in DRAWN
    if drawn:
        return shapes_of(from_hf_config(hf_config(size))), SharedParams(RandomShards())
    return build_model(size), place_params
