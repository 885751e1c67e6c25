"""Regenerate the HF-transformers reference fixtures under tests/fixtures/<family>/.

Run with the separate Python 3.11 env (torch 2.13.0 CPU, transformers 5.23.0), never from the
library or from pytest:

    HF_HUB_OFFLINE=1 /work/tfvenv/bin/python tests/reference/make_fixtures.py [--list] [family ...]

For each family it builds a tiny random float32 model, adds noise to every parameter (and to the
MoE router correction-bias buffer) so no weight sits at its trivial init value, saves it with
`save_pretrained` (config.json + model.safetensors) and writes expected.npz: full-sequence logits,
cached chunked-prefill + decode logits, and the conv / recurrent states of every recurrent layer
after the chunked run. See tests/reference/README.md for the array meanings and layouts.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import dataclasses  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import DynamicCache  # noqa: E402

torch.set_num_threads(1)  # thread oversubscription makes tiny models 100x slower on this box
transformers.logging.set_verbosity_error()  # silence the "falling back to PyTorch" warnings
transformers.logging.disable_progress_bar()

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
VOCAB = 128
TOKEN_SEED = 1234
TOL = 1e-4
MIN_MARGIN = 1e-4  # smallest allowed top-k routing gap (see _router_margin)
IDS = dict(
    vocab_size=VOCAB,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    max_position_embeddings=256,
)


def mamba2() -> tuple[type, Any]:
    """Mamba2: 2 Mamba2 layers, default time_step_limit (0, inf) so prefill and decode agree."""
    cfg = transformers.Mamba2Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_heads=8,
        head_dim=16,
        expand=2,
        state_size=16,
        n_groups=2,
        conv_kernel=4,
        chunk_size=16,
        time_step_rank=8,
        **IDS,
    )
    return transformers.Mamba2ForCausalLM, cfg


def nemotron_h() -> tuple[type, Any]:
    """NemotronH: Mamba2 / MLP / attention / group-limited sigmoid MoE with scaling."""
    cfg = transformers.NemotronHConfig(
        hidden_size=64,
        layers_block_type=[
            "linear_attention",
            "mlp",
            "full_attention",
            "moe",
            "linear_attention",
            "moe",
        ],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        mlp_hidden_act="relu2",
        mamba_num_heads=8,
        mamba_head_dim=16,
        ssm_state_size=16,
        n_groups=2,
        conv_kernel=4,
        chunk_size=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32,
        **IDS,
    )
    return transformers.NemotronHForCausalLM, cfg


GDN_COMMON = dict(
    hidden_size=64,
    num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    **IDS,
)


def qwen3_next() -> tuple[type, Any]:
    """Qwen3-Next: 3 GDN + 1 gated attention; layer 1 dense MLP, the rest MoE + shared expert."""
    cfg = transformers.Qwen3NextConfig(
        intermediate_size=128,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        norm_topk_prob=True,
        **GDN_COMMON,
    )
    return transformers.Qwen3NextForCausalLM, cfg


def qwen3_5() -> tuple[type, Any]:
    """Qwen3.5 dense text model: split GDN projections, dense MLP everywhere."""
    cfg = transformers.Qwen3_5TextConfig(intermediate_size=128, **GDN_COMMON)
    return transformers.Qwen3_5ForCausalLM, cfg


def qwen3_5_moe() -> tuple[type, Any]:
    """Qwen3.5 MoE text model: every layer MoE with a shared expert."""
    cfg = transformers.Qwen3_5MoeTextConfig(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        **GDN_COMMON,
    )
    return transformers.Qwen3_5MoeForCausalLM, cfg


def mamba2_odd() -> tuple[type, Any]:
    """Mamba2, odd dims: 6 heads x head_dim 24, d_state 12, 3 groups, conv_dim 216, chunk 32."""
    cfg = transformers.Mamba2Config(
        hidden_size=72,
        num_hidden_layers=2,
        num_heads=6,
        head_dim=24,
        expand=2,
        state_size=12,
        n_groups=3,
        conv_kernel=4,
        chunk_size=32,
        time_step_rank=5,
        **IDS,
    )
    return transformers.Mamba2ForCausalLM, cfg


def nemotron_h_odd() -> tuple[type, Any]:
    """NemotronH, odd dims: Mamba2 5 heads x 24, d_state 24, 5 groups (conv_dim 360), chunk 16;
    attention 6 heads / 3 KV heads x 24; 6 experts in 3 groups, top-2 from the best 2 groups."""
    cfg = transformers.NemotronHConfig(
        hidden_size=72,
        layers_block_type=[
            "linear_attention",
            "moe",
            "full_attention",
            "mlp",
            "linear_attention",
            "moe",
        ],
        num_attention_heads=6,
        num_key_value_heads=3,
        head_dim=24,
        intermediate_size=96,
        mlp_hidden_act="relu2",
        mamba_num_heads=5,
        mamba_head_dim=24,
        ssm_state_size=24,
        n_groups=5,
        conv_kernel=4,
        chunk_size=16,
        n_routed_experts=6,
        num_experts_per_tok=2,
        n_group=3,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=1.5,
        moe_intermediate_size=40,
        moe_shared_expert_intermediate_size=24,
        **IDS,
    )
    return transformers.NemotronHForCausalLM, cfg


def _gdn_odd(k_heads: int, v_heads: int, d_v: int, head_dim: int, kv_heads: int) -> dict:
    """Odd GDN hybrid dims: hidden 40, head_k_dim 24 (the H100 bug's), 6 attention heads."""
    return dict(
        hidden_size=40,
        num_hidden_layers=3,
        layer_types=["linear_attention", "linear_attention", "full_attention"],
        num_attention_heads=6,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        linear_num_key_heads=k_heads,
        linear_num_value_heads=v_heads,
        linear_key_head_dim=24,
        linear_value_head_dim=d_v,
        linear_conv_kernel_dim=4,
        **IDS,
    )


def qwen3_next_odd() -> tuple[type, Any]:
    """Qwen3-Next, odd dims: GDN 3 key / 6 value heads, d_v 40; attention 6 / 3 x 24; 6 experts."""
    cfg = transformers.Qwen3NextConfig(
        intermediate_size=96,
        num_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=40,
        shared_expert_intermediate_size=24,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        norm_topk_prob=True,
        **_gdn_odd(3, 6, 40, 24, 3),
    )
    return transformers.Qwen3NextForCausalLM, cfg


def qwen3_5_odd() -> tuple[type, Any]:
    """Qwen3.5 dense, odd dims: GDN 3 key / 6 value heads, d_v 48; attention 6 / 3 x head_dim 80."""
    cfg = transformers.Qwen3_5TextConfig(intermediate_size=96, **_gdn_odd(3, 6, 48, 80, 3))
    return transformers.Qwen3_5ForCausalLM, cfg


def qwen3_5_moe_odd() -> tuple[type, Any]:
    """Qwen3.5 MoE, odd dims: GDN 1 key / 5 value heads, d_v 40 (conv_dim 248); attention 6 / 2 x
    24; 6 experts, top-3."""
    cfg = transformers.Qwen3_5MoeTextConfig(
        num_experts=6,
        num_experts_per_tok=3,
        moe_intermediate_size=40,
        shared_expert_intermediate_size=24,
        **_gdn_odd(1, 5, 40, 24, 2),
    )
    return transformers.Qwen3_5MoeForCausalLM, cfg


@dataclasses.dataclass(frozen=True)
class Fixture:
    """One fixture: its model, its two sequence lengths and its chunk schedules.

    A schedule lists (start, stop) calls on one cache; after the last chunk the sequence goes one
    token per call (decode).
    """

    make: Callable[[], tuple[type, Any]]
    len_a: int
    len_b: int
    chunks_a: tuple[tuple[int, int], ...]
    chunks_b: tuple[tuple[int, int], ...]


# The five originals: 80 / 23 tokens, chunk ends on multiples of 16.
_SMALL = dict(len_a=80, len_b=23, chunks_a=((0, 32), (32, 48)), chunks_b=((0, 16),))
# The odd ones: a covers two GDN chunks (64) plus a remainder, b one chunk plus a token; no chunk
# boundary is a multiple of 16, and (50, 139) crosses two GDN chunk ends and starts mid-chunk.
_ODD = dict(
    len_a=181, len_b=65, chunks_a=((0, 50), (50, 139), (139, 170)), chunks_b=((0, 33), (33, 61))
)
FAMILIES: dict[str, Fixture] = {
    "mamba2": Fixture(mamba2, **_SMALL),
    "nemotron_h": Fixture(nemotron_h, **_SMALL),
    "qwen3_next": Fixture(qwen3_next, **_SMALL),
    "qwen3_5": Fixture(qwen3_5, **_SMALL),
    "qwen3_5_moe": Fixture(qwen3_5_moe, **_SMALL),
    "mamba2_odd": Fixture(mamba2_odd, **_ODD),
    "nemotron_h_odd": Fixture(nemotron_h_odd, **_ODD),
    "qwen3_next_odd": Fixture(qwen3_next_odd, **_ODD),
    "qwen3_5_odd": Fixture(qwen3_5_odd, **_ODD),
    "qwen3_5_moe_odd": Fixture(qwen3_5_moe_odd, **_ODD),
}


def perturb(model: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """Add N(0, scale^2) noise to every parameter and every non-rotary buffer, in place.

    Zero-centred norms (init 0), unit gated norms, constant D / dt_bias and the zero MoE
    correction bias would otherwise hide swapped or mis-laid-out weights.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale)
        for name, b in model.named_buffers():
            if "inv_freq" in name or not b.is_floating_point():
                continue
            b.add_(torch.randn(b.shape, generator=gen, dtype=b.dtype) * scale)


def make_tokens(seed: int, len_a: int, len_b: int) -> tuple[np.ndarray, np.ndarray]:
    """Two int32 token sequences of lengths len_a and len_b with ids in [3, VOCAB)."""
    rng = np.random.default_rng(seed)
    seq_a = rng.integers(3, VOCAB, size=len_a, dtype=np.int64).astype(np.int32)
    seq_b = rng.integers(3, VOCAB, size=len_b, dtype=np.int64).astype(np.int32)
    return seq_a, seq_b


def full_logits(model: torch.nn.Module, seq: np.ndarray) -> np.ndarray:
    """[L, V] logits of one uncached forward over the whole sequence (batch 1)."""
    ids = torch.from_numpy(seq.astype(np.int64))[None]
    with torch.no_grad():
        return model(ids, use_cache=False).logits[0].float().numpy()


def chunked_logits(
    model: torch.nn.Module, seq: np.ndarray, chunks: tuple[tuple[int, int], ...]
) -> tuple[np.ndarray, DynamicCache]:
    """[L, V] logits of the sequence fed through one cache: the given chunks, then 1 token/call.

    Mamba2ForCausalLM takes the cache as `cache_params=`; the others as `past_key_values=` with
    explicit position_ids (some HF models default positions to arange(seq_len) otherwise).
    """
    is_mamba2 = type(model).__name__.startswith("Mamba2")
    ids = torch.from_numpy(seq.astype(np.int64))[None]
    cache = DynamicCache(config=model.config)
    spans = list(chunks) + [(t, t + 1) for t in range(chunks[-1][1], len(seq))]
    out = []
    with torch.no_grad():
        for start, stop in spans:
            kwargs: dict[str, Any] = {"use_cache": True}
            if is_mamba2:
                kwargs["cache_params"] = cache
            else:
                kwargs["past_key_values"] = cache
                kwargs["position_ids"] = torch.arange(start, stop)[None]
            out.append(model(ids[:, start:stop], **kwargs).logits[0].float())
    return torch.cat(out, 0).numpy(), cache


def recurrent_states(cache: DynamicCache, layers: list[int], tag: str) -> dict[str, np.ndarray]:
    """conv_{tag}_{i} [conv_dim, K] and rec_{tag}_{i} (HF layout) for batch row 0 of each layer."""
    out: dict[str, np.ndarray] = {}
    for i in layers:
        layer = cache.layers[i]
        out[f"conv_{tag}_{i}"] = layer.conv_states[0][0].float().numpy().copy()
        out[f"rec_{tag}_{i}"] = layer.recurrent_states[0][0].float().numpy().copy()
    return out


def _router_margin(router: torch.nn.Module, logits: torch.Tensor) -> float:
    """Smallest gap, over tokens, between the last chosen and the first rejected candidate.

    A tiny gap means a float32 port could legitimately pick other experts, so the fixture would
    make parity tests flaky. Softmax routers: gap in probability at rank top_k. NemotronH's
    sigmoid router: the min of the group-choice gap and the in-group expert-choice gap.
    """
    k = router.top_k
    if not hasattr(router, "e_score_correction_bias"):
        probs = torch.softmax(logits.float(), dim=-1).sort(dim=-1, descending=True).values
        return float((probs[:, k - 1] - probs[:, k]).min())
    choice = logits.float().sigmoid() + router.e_score_correction_bias
    grouped = choice.view(choice.shape[0], router.num_group, -1)
    group_scores = grouped.topk(2, dim=-1).values.sum(-1).sort(dim=-1, descending=True).values
    g = router.topk_group
    gap = float("inf")
    if g < router.num_group:
        gap = float((group_scores[:, g - 1] - group_scores[:, g]).min())
    keep = grouped.sum(-1).new_zeros(grouped.shape[:2], dtype=torch.bool)
    keep.scatter_(1, grouped.topk(2, dim=-1).values.sum(-1).topk(g, dim=-1).indices, True)
    masked = grouped.masked_fill(~keep[..., None], float("-inf")).flatten(1)
    ranked = masked.sort(dim=-1, descending=True).values
    return min(gap, float((ranked[:, k - 1] - ranked[:, k]).min()))


def routing_margin(model: torch.nn.Module, seqs: list[np.ndarray]) -> float:
    """Smallest top-k selection gap of every MoE router over full forwards of seqs (inf if none)."""
    routers = [m for m in model.modules() if type(m).__name__.lower().endswith("topkrouter")]
    margins: list[float] = []
    hooks = [
        r.register_forward_hook(lambda mod, _inp, out: margins.append(_router_margin(mod, out[0])))
        for r in routers
    ]
    for seq in seqs:
        full_logits(model, seq)
    for h in hooks:
        h.remove()
    return min(margins, default=float("inf"))


def build(family: str, seqs: list[np.ndarray]) -> tuple[torch.nn.Module, list[int], float]:
    """The perturbed eval-mode model of a family, its recurrent HF layer indices, its routing gap.

    The noise seed is the first of 1, 2, ... whose model has no MoE near-tie on seqs (see
    _router_margin), so the fixtures stay deterministic and parity tests cannot flip experts.
    """
    cls, cfg = FAMILIES[family].make()
    for seed in range(1, 21):
        torch.manual_seed(0)
        model = cls(cfg).float().eval()
        perturb(model, seed=seed)
        margin = routing_margin(model, seqs)
        if margin > MIN_MARGIN:
            print(f"{family:15s} noise seed {seed}")
            break
    else:
        raise AssertionError(f"{family}: every seed has a router near-tie (last {margin:.2e})")
    recurrent = [i for i, t in enumerate(model.config.layer_types) if t == "linear_attention"]
    return model, recurrent, margin


def make_family(family: str) -> dict[str, float]:
    """Save one family's model and expected.npz; returns the max chunked-vs-full diffs."""
    spec = FAMILIES[family]
    seq_a, seq_b = make_tokens(TOKEN_SEED, spec.len_a, spec.len_b)
    diffs: dict[str, float] = {}
    model, recurrent, diffs["margin"] = build(family, [seq_a, seq_b])
    out_dir = FIXTURES / family
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "generation_config.json").unlink(missing_ok=True)

    arrays: dict[str, np.ndarray] = {"seq_a": seq_a, "seq_b": seq_b}
    for tag, seq, chunks in (("a", seq_a, spec.chunks_a), ("b", seq_b, spec.chunks_b)):
        full = full_logits(model, seq)
        chunked, cache = chunked_logits(model, seq, chunks)
        diffs[tag] = float(np.abs(full - chunked).max())
        assert diffs[tag] < TOL, f"{family} seq_{tag}: chunked vs full {diffs[tag]:.2e}"
        arrays[f"logits_full_{tag}"] = full.astype(np.float32)
        arrays[f"logits_chunked_{tag}"] = chunked.astype(np.float32)
        arrays.update(recurrent_states(cache, recurrent, tag))
        arrays[f"chunks_{tag}"] = np.asarray(chunks, dtype=np.int32)
    arrays["recurrent_layers"] = np.asarray(recurrent, dtype=np.int32)
    np.savez(out_dir / "expected.npz", **arrays)
    check_reload(model, out_dir, seq_b, arrays["logits_full_b"])
    return diffs


def check_reload(model: torch.nn.Module, out_dir: Path, seq: np.ndarray, ref: np.ndarray) -> None:
    """The saved checkpoint must reload (disk -> memory conversion) to the same logits."""
    reloaded = type(model).from_pretrained(out_dir).eval()
    diff = float(np.abs(full_logits(reloaded, seq) - ref).max())
    assert diff == 0.0, f"{out_dir.name}: reload changed logits by {diff:.2e}"


def tensor_listing(path: Path) -> list[str]:
    """On-disk tensor names and shapes, layer / expert indices folded into {i} / {e}."""
    rows: dict[tuple[str, tuple[int, ...]], set[int]] = {}
    with safe_open(str(path), "pt") as f:
        for key in f.keys():
            shape = tuple(f.get_slice(key).get_shape())
            m = re.match(r"(.*?layers\.)(\d+)\.(.*)", key)
            if m is None:
                rows.setdefault((key, shape), set())
                continue
            rest = re.sub(r"experts\.\d+\.", "experts.{e}.", m.group(3))
            rows.setdefault((f"{m.group(1)}{{i}}.{rest}", shape), set()).add(int(m.group(2)))
    return [
        f"{name} {list(shape)}" + (f"  i={sorted(layers)}" if layers else "")
        for (name, shape), layers in sorted(rows.items())
    ]


def main(argv: list[str]) -> None:
    """Regenerate the families named in argv (all when none)."""
    show = "--list" in argv
    families = [a for a in argv if a != "--list"] or list(FAMILIES)
    print(f"torch {torch.__version__}  transformers {transformers.__version__}")
    for family in families:
        diffs = make_family(family)
        sizes = {p.name: p.stat().st_size for p in sorted((FIXTURES / family).iterdir())}
        print(
            f"{family:15s} chunked-vs-full a={diffs['a']:.2e} b={diffs['b']:.2e} "
            f"route-gap={diffs['margin']:.1e}  " + " ".join(f"{k}={v}" for k, v in sizes.items())
        )
        if show:
            for row in tensor_listing(FIXTURES / family / "model.safetensors"):
                print("    " + row)


if __name__ == "__main__":
    main(sys.argv[1:])
