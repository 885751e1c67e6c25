"""Which checkpoint tensors make which parameter of `HybridLM`: the names transformers writes on
disk (`save_pretrained` reverts its in-memory fusions) and the transform each way.

NemotronH and Mamba2 live under `backbone.`, the Qwen3.5 multimodal wrappers' text model under
`model.language_model.`, the rest under `model.`; one tensor per expert (but Granite's stacked
experts and fused gate | up, which transformers keeps on disk); HF linear weights are [out, in],
ours [in, out]. Falcon-H1's constant multipliers inside a layer are folded into the weights here
(`jmamba.checkpoints.folding`), and so are Zamba2's LoRA adapters, into each use site's copy of a
shared transformer block (`jmamba.mixers.transformer_mamba2`).
"""

from __future__ import annotations

import numpy as np

from jmamba.checkpoints.families.registry import WRAPPERS
from jmamba.checkpoints.folding import (
    lora_fold,
    lora_product,
    lora_unfold,
    mamba2_in_proj_scale,
    scaled,
)
from jmamba.checkpoints.source import (
    Path_,
    Source,
    conv,
    experts,
    half,
    linear,
    same,
    same_axis,
    swapped,
)
from jmamba.config import Ffn, Mixer, ModelConfig
from jmamba.mixers.mamba2 import a_from_log, log_from_a


def _a_from_log(name: str) -> Source:
    return Source((name,), a_from_log, lambda p: (log_from_a(p),), read_axis=same_axis)


def _deinterleave_qwen3_next(qkvz: np.ndarray, ba: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Qwen3-Next packs q|k|v|z (and b|a) per key-head group; we use flat [q|k|v|z|b|a]."""
    g = cfg.need_gdn()
    r = g.num_v_heads // g.num_k_heads
    per_group = qkvz.reshape(g.num_k_heads, -1, qkvz.shape[-1])
    q, k, v, z = np.split(
        per_group, np.cumsum([g.head_k_dim, g.head_k_dim, r * g.head_v_dim]), axis=1
    )
    b, a = np.split(ba.reshape(g.num_k_heads, 2 * r, -1), [r], axis=1)
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    return np.concatenate([flat(t) for t in (q, k, v, z, b, a)]).T


def _interleave_qwen3_next(in_proj: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of `_deinterleave_qwen3_next`: our [in, q|k|v|z|b|a] -> HF (qkvz, ba)."""
    g = cfg.need_gdn()
    sizes = [g.key_dim, g.key_dim, g.value_dim, g.value_dim, g.num_v_heads]
    q, k, v, z, b, a = np.split(in_proj.T, np.cumsum(sizes), axis=0)
    grouped = lambda t: t.reshape(g.num_k_heads, -1, t.shape[-1])  # noqa: E731
    qkvz = np.concatenate([grouped(t) for t in (q, k, v, z)], axis=1)
    ba = np.concatenate([grouped(b), grouped(a)], axis=1)
    return qkvz.reshape(-1, qkvz.shape[-1]), ba.reshape(-1, ba.shape[-1])


def _gdn_in_proj(prefix: str, cfg: ModelConfig) -> Source:
    if cfg.architecture == "Qwen3NextForCausalLM":
        return Source(
            (f"{prefix}.in_proj_qkvz.weight", f"{prefix}.in_proj_ba.weight"),
            lambda qkvz, ba: _deinterleave_qwen3_next(qkvz, ba, cfg),
            lambda p: _interleave_qwen3_next(p, cfg),
        )
    g = cfg.need_gdn()
    names = tuple(f"{prefix}.in_proj_{p}.weight" for p in ("qkv", "z", "b", "a"))
    ends = np.cumsum([g.conv_dim, g.value_dim, g.num_v_heads])
    return Source(
        names, lambda *ts: np.concatenate(ts).T, lambda p: tuple(np.split(p.T, ends, axis=0))
    )


def _attention_sources(hf: str, cfg: ModelConfig) -> dict[Path_, Source]:
    mult = cfg.multipliers
    scales = {
        "q_proj": mult.attention_in,
        "k_proj": mult.attention_in * mult.attention_key,
        "v_proj": mult.attention_in,
        "o_proj": mult.attention_out,
    }
    src: dict[Path_, Source] = {
        (p, "kernel"): scaled(linear(f"{hf}.{p}"), scale) for p, scale in scales.items()
    }
    if cfg.need_attention().qk_norm:
        src.update({(n, "weight"): same(f"{hf}.{n}.weight") for n in ("q_norm", "k_norm")})
    return src


def _mixer_sources(kind: Mixer, hf: str, cfg: ModelConfig) -> dict[Path_, Source]:
    match kind:
        case Mixer.MAMBA2:
            mamba2 = cfg.need_mamba2()
            src: dict[Path_, Source] = {
                ("in_proj", "kernel"): scaled(linear(f"{hf}.in_proj"), mamba2_in_proj_scale(cfg)),
                ("conv_weight",): conv(f"{hf}.conv1d"),
                ("out_proj", "kernel"): scaled(
                    linear(f"{hf}.out_proj"), cfg.multipliers.mamba2_out
                ),
            }
            if mamba2.gate_norm != "gate_only":
                src[("norm", "weight")] = same(f"{hf}.norm.weight")
            if mamba2.conv_bias:
                src[("conv_bias",)] = same(f"{hf}.conv1d.bias")
            src.update({(p,): same(f"{hf}.{p}") for p in ("dt_bias", "D")})
            src[("A",)] = _a_from_log(f"{hf}.A_log")
            return src
        case Mixer.GDN:
            return {
                ("in_proj", "kernel"): _gdn_in_proj(hf, cfg),
                ("conv_weight",): conv(f"{hf}.conv1d"),
                ("dt_bias",): same(f"{hf}.dt_bias"),
                ("A_log",): same(f"{hf}.A_log"),
                ("norm", "weight"): same(f"{hf}.norm.weight"),
                ("out_proj", "kernel"): linear(f"{hf}.out_proj"),
            }
        case Mixer.ATTENTION:
            return _attention_sources(hf, cfg)
        case Mixer.PARALLEL_HYBRID:  # Falcon-H1: `self_attn` and `mamba` inside the layer
            halves = {
                "attention": _attention_sources(f"{hf}.self_attn", cfg),
                "mamba2": _mixer_sources(Mixer.MAMBA2, f"{hf}.mamba", cfg),
            }
            return {(h, *k): v for h, src in halves.items() for k, v in src.items()}
    return {}


def _granite_ffn_sources(kind: Ffn, hf: str) -> dict[Path_, Source]:
    """Granite-4.0-H (`hf` the layer): the shared MLP (`shared_mlp`) alone, or beside the MoE
    (`block_sparse_moe`, its experts stacked); both keep gate | up fused in `input_linear`."""
    shared: dict[Path_, Source] = {
        ("gate_proj", "kernel"): half(f"{hf}.shared_mlp.input_linear", 0),
        ("up_proj", "kernel"): half(f"{hf}.shared_mlp.input_linear", 1),
        ("down_proj", "kernel"): linear(f"{hf}.shared_mlp.output_linear"),
    }
    if kind != Ffn.MOE:
        return shared
    moe = f"{hf}.block_sparse_moe"
    return {
        ("router", "kernel"): linear(f"{moe}.router.layer"),
        ("gate_proj",): half(f"{moe}.input_linear", 0),
        ("up_proj",): half(f"{moe}.input_linear", 1),
        ("down_proj",): swapped(f"{moe}.output_linear"),
        **{("shared", *k): v for k, v in shared.items()},
    }


def _mlp_sources(hf: str, gated: bool) -> dict[tuple[str, str], Source]:
    projs = ("gate_proj", "up_proj", "down_proj") if gated else ("up_proj", "down_proj")
    return {(p, "kernel"): linear(f"{hf}.{p}") for p in projs}


def _ffn_sources(kind: Ffn, hf: str, cfg: ModelConfig) -> dict[Path_, Source]:
    if cfg.architecture == "GraniteMoeHybridForCausalLM":
        return _granite_ffn_sources(kind, hf)
    match kind:
        case Ffn.MLP:
            scales = {"gate_proj": cfg.multipliers.mlp_gate, "down_proj": cfg.multipliers.mlp_down}
            mlp = _mlp_sources(hf, cfg.need_mlp().activation == "silu_gated")
            return {k: scaled(v, scales.get(k[0], 1.0)) for k, v in mlp.items()}
        case Ffn.MOE:
            moe = cfg.need_moe()
            gated = moe.activation == "silu_gated"
            src: dict[Path_, Source] = {("router", "kernel"): linear(f"{hf}.gate")}
            for proj in (
                ("gate_proj", "up_proj", "down_proj") if gated else ("up_proj", "down_proj")
            ):
                src[(proj,)] = experts(hf, proj, moe.num_experts)
            shared = "shared_expert" if moe.shared_gate else "shared_experts"
            src.update(
                {("shared", *k): v for k, v in _mlp_sources(f"{hf}.{shared}", gated).items()}
            )
            if moe.shared_gate:
                src[("shared_gate", "kernel")] = linear(f"{hf}.shared_expert_gate")
            if moe.router == "sigmoid_grouped":
                src[("router_bias",)] = same(f"{hf}.gate.e_score_correction_bias")
            return src
    return {}


def _model_prefix(cfg: ModelConfig) -> str:
    """Where the text model's tensors are: `model.` (Qwen, Falcon-H1, Bamba, Granite),
    `model.language_model.` (in a multimodal wrapper), `backbone.` (Mamba2, NemotronH)."""
    if cfg.architecture in ("Mamba2ForCausalLM", "NemotronHForCausalLM"):
        return "backbone."
    return "model.language_model." if cfg.architecture in WRAPPERS else "model."


# Bamba's and Granite-4.0-H's (FFN norm, FFN) under model.layers.{i}; their mixers are `mamba` or
# `self_attn`. Granite's FFN is the layer itself: its MoE and shared MLP have a name each (see
# _granite_ffn_sources).
_IBM_LAYERS = {
    "BambaForCausalLM": ("pre_ff_layernorm", ".feed_forward"),
    "GraniteMoeHybridForCausalLM": ("post_attention_layernorm", ""),
}


def _layer_names(cfg: ModelConfig, i: int) -> tuple[str, str, str, str]:
    """HF names of (mixer norm, mixer, ffn norm, ffn) of layer i."""
    if cfg.architecture in ("Mamba2ForCausalLM", "NemotronHForCausalLM"):
        layer = f"backbone.layers.{i}"
        return f"{layer}.norm", f"{layer}.mixer", f"{layer}.norm", f"{layer}.mixer"
    layer = f"{_model_prefix(cfg)}layers.{i}"
    if cfg.architecture == "FalconH1ForCausalLM":  # the mixer's two halves are named inside
        return (
            f"{layer}.input_layernorm",
            layer,
            f"{layer}.pre_ff_layernorm",
            f"{layer}.feed_forward",
        )
    if cfg.architecture == _ZAMBA2:  # no FFN; hybrid layers: _transformer_mamba2_sources
        return f"{layer}.input_layernorm", f"{layer}.mamba", "", ""
    if cfg.architecture in _IBM_LAYERS:
        norm, ffn = _IBM_LAYERS[cfg.architecture]
        mixer = "self_attn" if cfg.mixers[i] == Mixer.ATTENTION else "mamba"
        return f"{layer}.input_layernorm", f"{layer}.{mixer}", f"{layer}.{norm}", f"{layer}{ffn}"
    mixer = "self_attn" if cfg.mixers[i] == Mixer.ATTENTION else "linear_attn"
    return (
        f"{layer}.input_layernorm",
        f"{layer}.{mixer}",
        f"{layer}.post_attention_layernorm",
        f"{layer}.mlp",
    )


_ZAMBA2 = "Zamba2ForCausalLM"
# Zamba2's adapted kernels of a shared block: (our module path, our adapter, HF kernel, HF adapter
# list prefix), under the block's `shared_transformer.`; q, k, v only with attention adapters.
_ADAPTED_ATTENTION = tuple(
    (("attention", f"{p}_proj"), f"{p}_adapter", f"self_attn.{p}_proj", f"self_attn.linear_{p}")
    for p in "qkv"
)
_ADAPTED_MLP = (
    ("mlp", "gate_up_proj"),
    "gate_up_adapter",
    "feed_forward.gate_up_proj",  # the HF kernel and its adapter list share the name
    "feed_forward.gate_up_proj",
)


def _shared_kernel(
    weight: str, lora: tuple[str, str], joint: tuple[Path_, ...], own: int
) -> Source:
    """A shared kernel at one use site with the site's adapter `lora` (down, up) folded in; `joint`
    holds (kernel, down, up) of every use site of the block, this one at position `own`."""

    def split(_: np.ndarray, *values: np.ndarray) -> tuple[np.ndarray, ...]:
        kernels, downs, ups = values[0::3], values[1::3], values[2::3]
        shared = lora_unfold(
            list(kernels), [lora_product(d, u) for d, u in zip(downs, ups, strict=True)]
        )
        return shared.T, downs[own].T, ups[own].T

    build = lambda w, a, b: lora_fold(w.T, a.T, b.T)  # noqa: E731
    return Source((f"{weight}.weight", *lora), build, split, joint=joint)


def _transformer_mamba2_sources(cfg: ModelConfig, i: int) -> dict[Path_, Source]:
    """Zamba2's hybrid layer i: the j-th hybrid layer uses shared block j % num_mem_blocks, whose
    tensors (and every use site's adapters, numbered j) lie under the block's first use site; the
    layer's own `linear` and Mamba2 mixer (`mamba_decoder`) under it."""
    hybrid = [k for k, m in enumerate(cfg.mixers) if m == Mixer.TRANSFORMER_MAMBA2]
    block = cfg.need_shared_block()
    j = hybrid.index(i)
    sites = hybrid[j % block.num_blocks :: block.num_blocks]
    shared, layer = f"model.layers.{sites[0]}.shared_transformer", f"model.layers.{i}"
    src: dict[Path_, Source] = {
        ("block_norm", "weight"): same(f"{shared}.input_layernorm.weight"),
        ("attention", "o_proj", "kernel"): linear(f"{shared}.self_attn.o_proj"),
        ("ffn_norm", "weight"): same(f"{shared}.pre_ff_layernorm.weight"),
        ("mlp", "down_proj", "kernel"): linear(f"{shared}.feed_forward.down_proj"),
        ("linear", "kernel"): linear(f"{layer}.linear"),
        ("mamba_norm", "weight"): same(f"{layer}.mamba_decoder.input_layernorm.weight"),
    }
    mamba = _mixer_sources(Mixer.MAMBA2, f"{layer}.mamba_decoder.mamba", cfg)
    src.update({("mamba2", *k): v for k, v in mamba.items()})
    adapted = (*_ADAPTED_ATTENTION, _ADAPTED_MLP) if block.attention_adapters else (_ADAPTED_MLP,)
    if not block.attention_adapters:
        src.update({(*m, "kernel"): linear(f"{shared}.{w}") for m, _, w, _ in _ADAPTED_ATTENTION})
    for module, adapter, weight, lora in adapted:
        down, up = (f"{shared}.{lora}_adapter_list.{j}.{k}" for k in (0, 1))
        joint = tuple(
            ("layers", s, "mixer", *path)
            for s in sites
            for path in ((*module, "kernel"), (adapter, "down"), (adapter, "up"))
        )
        own = sites.index(i)
        src[(*module, "kernel")] = _shared_kernel(
            f"{shared}.{weight}", (f"{down}.weight", f"{up}.weight"), joint, own
        )
        src[(adapter, "down")], src[(adapter, "up")] = linear(down), linear(up)
    return src


_FINAL_NORMS = {
    "FalconH1ForCausalLM": "model.final_layernorm.weight",
    "BambaForCausalLM": "model.final_layernorm.weight",
    "Zamba2ForCausalLM": "model.final_layernorm.weight",
}


def tensor_sources(cfg: ModelConfig) -> dict[Path_, Source]:
    """Map every parameter path of `HybridLM(cfg)` to the HF tensors it is built from."""
    if cfg.architecture in ("Mamba2ForCausalLM", "NemotronHForCausalLM"):
        embed, final = "backbone.embeddings.weight", "backbone.norm_f.weight"
    else:
        prefix = _model_prefix(cfg)
        embed, final = f"{prefix}embed_tokens.weight", f"{prefix}norm.weight"
    final = _FINAL_NORMS.get(cfg.architecture, final)
    src: dict[Path_, Source] = {("embed",): same(embed), ("final_norm", "weight"): same(final)}
    if not cfg.tie_word_embeddings:
        src[("lm_head", "kernel")] = linear("lm_head")
    for i, (mixer, ffn) in enumerate(zip(cfg.mixers, cfg.ffns, strict=True)):
        if mixer.reads_embeddings:  # it norms its own inputs: no mixer_norm
            src.update(
                {
                    ("layers", i, "mixer", *k): v
                    for k, v in _transformer_mamba2_sources(cfg, i).items()
                }
            )
            mixer = Mixer.NONE
        layer = _layer_sources(mixer, ffn, _layer_names(cfg, i), cfg)
        src.update({("layers", i, *k): v for k, v in layer.items()})
    src.update({("mtp", *k): v for k, v in _mtp_sources(cfg).items()})
    return src


def _layer_sources(
    mixer: Mixer, ffn: Ffn, names: tuple[str, str, str, str], cfg: ModelConfig
) -> dict[Path_, Source]:
    """A `jmamba.layer.Layer`'s parameters from the HF names of its (mixer norm, mixer, ffn norm,
    ffn)."""
    mixer_norm, mixer_hf, ffn_norm, ffn_hf = names
    src: dict[Path_, Source] = {}
    if mixer != Mixer.NONE:
        src[("mixer_norm", "weight")] = same(f"{mixer_norm}.weight")
        src.update({("mixer", *k): v for k, v in _mixer_sources(mixer, mixer_hf, cfg).items()})
    if ffn != Ffn.NONE:
        src[("ffn_norm", "weight")] = same(f"{ffn_norm}.weight")
        src.update({("ffn", *k): v for k, v in _ffn_sources(ffn, ffn_hf, cfg).items()})
    return src


def _mtp_sources(cfg: ModelConfig) -> dict[Path_, Source]:
    """The MTP head (`jmamba.mtp.MTPHead`) under `mtp.`: Qwen's names (`fc`, `pre_fc_norm_*`,
    `norm`, decoder layers as the model's), or NemotronH's (blocks as the model's, the first
    holding `enorm`, `hnorm`, `eh_proj`, the last `final_layernorm`)."""
    if not cfg.has_mtp:
        return {}
    last = len(cfg.mtp_mixers) - 1
    if cfg.architecture == "NemotronHForCausalLM":
        head = {
            "embedding_norm": same("mtp.layers.0.enorm.weight"),
            "hidden_norm": same("mtp.layers.0.hnorm.weight"),
            "norm": same(f"mtp.layers.{last}.final_layernorm.weight"),
        }
        fuse = linear("mtp.layers.0.eh_proj")
        names = lambda i: (f"mtp.layers.{i}.norm", f"mtp.layers.{i}.mixer") * 2  # noqa: E731
    else:
        head = {
            "embedding_norm": same("mtp.pre_fc_norm_embedding.weight"),
            "hidden_norm": same("mtp.pre_fc_norm_hidden.weight"),
            "norm": same("mtp.norm.weight"),
        }
        fuse = linear("mtp.fc")
        names = lambda i: (  # noqa: E731
            f"mtp.layers.{i}.input_layernorm",
            f"mtp.layers.{i}.self_attn",
            f"mtp.layers.{i}.post_attention_layernorm",
            f"mtp.layers.{i}.mlp",
        )
    src: dict[Path_, Source] = {(k, "weight"): v for k, v in head.items()}
    src[("fuse", "kernel")] = fuse
    for i, (mixer, ffn) in enumerate(zip(cfg.mtp_mixers, cfg.mtp_ffns, strict=True)):
        layer = _layer_sources(mixer, ffn, names(i), cfg)
        src.update({("layers", i, *k): v for k, v in layer.items()})
    return src
