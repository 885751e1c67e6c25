"""The fixture families of `make_fixtures.py`: each one's tiny random HF model (class and config,
from `first_families.py` and `more_families.py`), its two sequence lengths and its chunk schedules
(`FAMILIES`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import transformers
from first_families import (
    mamba2,
    mamba2_odd,
    nemotron_h,
    nemotron_h_odd,
    qwen3_5,
    qwen3_5_moe,
    qwen3_5_moe_odd,
    qwen3_5_moe_vl,
    qwen3_5_odd,
    qwen3_5_vl,
    qwen3_next,
    qwen3_next_odd,
)
from more_families import (
    bamba,
    bamba_odd,
    falcon_h1,
    falcon_h1_odd,
    granite_h,
    granite_h_odd,
    zamba2,
    zamba2_odd,
)


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
    # A multimodal wrapper: the text model's own class, whose logits on the wrapper's language-model
    # weights must equal the wrapper's text-only logits (make_fixtures.check_text_model).
    text_class: type | None = None
    # Write the tensors under their in-memory names (experts packed as `experts.gate_up_proj`
    # [E, 2I, H] and `experts.down_proj` [E, H, I], as the published Qwen3.5 MoE checkpoints hold
    # them) instead of `save_pretrained`'s one tensor per expert.
    packed_experts: bool = False
    # An MTP head (mtp_runs.py) beside the target: its `mtp.*` tensors are appended to
    # model.safetensors, these fields to config.json, and its arrays to expected.npz.
    mtp_config: dict[str, Any] | None = None
    # How far a reload of the written file may move the recorded logits: 0 (byte-identical
    # compute) except where transformers' loader takes another CPU matmul path (below).
    reload_tol: float = 0.0


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
    "falcon_h1": Fixture(falcon_h1, **_SMALL),
    "falcon_h1_odd": Fixture(falcon_h1_odd, **_ODD),
    "bamba": Fixture(bamba, **_SMALL),
    "bamba_odd": Fixture(bamba_odd, **_ODD),
    "granite_h": Fixture(granite_h, **_SMALL),
    "granite_h_odd": Fixture(granite_h_odd, **_ODD),
    "zamba2": Fixture(zamba2, **_SMALL),
    "zamba2_odd": Fixture(zamba2_odd, **_ODD),
    "qwen3_5_vl": Fixture(qwen3_5_vl, **_ODD, text_class=transformers.Qwen3_5ForCausalLM),
    "qwen3_5_moe_vl": Fixture(
        qwen3_5_moe_vl, **_ODD, text_class=transformers.Qwen3_5MoeForCausalLM, packed_experts=True
    ),
    # The targets of qwen3_next / qwen3_5 (same weights) with one MTP layer. The layer-count
    # field is the one each family's readers use (README, "MTP fixtures").
    "qwen3_next_mtp": Fixture(qwen3_next, **_SMALL, mtp_config={"num_nextn_predict_layers": 1}),
    "qwen3_5_mtp": Fixture(
        qwen3_5,
        **_SMALL,
        mtp_config={"mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False},
    ),
    # Qwen3.5 MoE with its head's experts packed, as the published checkpoints store both. The
    # text-only class reloads packed experts 4.2e-7 away on the logits.
    "qwen3_5_moe_mtp": Fixture(
        qwen3_5_moe,
        **_SMALL,
        packed_experts=True,
        mtp_config={"mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False},
        reload_tol=1e-6,
    ),
}
