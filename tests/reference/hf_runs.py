"""Running a fixture's HF model: weight noise, the token sequences, full and chunked (cached)
logits, and the recurrent states left in the cache."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from fixture_ids import VOCAB
from transformers import DynamicCache


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
            # Falcon-H1's mup_vector is rebuilt from config.json on load (it is not saved).
            if "inv_freq" in name or "mup_vector" in name or not b.is_floating_point():
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
