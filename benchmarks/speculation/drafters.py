"""The bench's drafters beyond the engine's own: a small random draft model of the bench model's
family, and the UPPER BOUND oracle that proposes a known continuation; and how a method's name
("mtp-2@16") reads."""

from __future__ import annotations

from flax import nnx

from benchmarks.harness.models import hf_config
from jmamba import HybridLM
from jmamba.checkpoints.families.registry import from_hf_config
from jmamba.checkpoints.weights import cast
from runtime.core.request import Request
from runtime.core.speculative_config import SpeculativeConfig
from runtime.speculative.ngram import NgramDrafter


def draft_hf_config(size: str) -> dict:
    """The bench model's family and vocabulary, 4 layers (Mamba2, MLP, attention, MLP), narrower."""
    config = hf_config(size)
    config["layers_block_type"] = ["mamba", "mlp", "attention", "mlp"]
    if size != "tiny":
        config.update(
            hidden_size=512,
            mamba_num_heads=16,
            mamba_head_dim=64,
            n_groups=8,
            intermediate_size=2048,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=64,
        )
    return config


def build_draft_model(size: str) -> HybridLM:
    """A random draft model (seed 1) with bf16 weights, as the bench model."""
    return cast(HybridLM(from_hf_config(draft_hf_config(size)), rngs=nnx.Rngs(1)), "bfloat16")


class OracleDrafter(NgramDrafter):
    """UPPER BOUND drafter: proposes the next K tokens of a known continuation (`truth`) where
    prompt lookup would look its tokens up; the rest is `NgramDrafter`'s (host drafts, nothing
    on the device)."""

    def __init__(self, truth: dict[str, list[int]], spec: SpeculativeConfig) -> None:
        super().__init__(spec)
        self.truth = truth

    def num_wanted(self, request: Request) -> int:
        done, k = len(request.output_token_ids), self.config.num_speculative_tokens
        self._proposals[request] = self.truth[request.request_id][done : done + k]
        return len(self._proposals[request])


def parse_method(method: str) -> tuple[str, int, int | None, bool]:
    """(kind, K, max_batch_size, adaptive) of a method name: "mtp-2@16" is ("mtp", 2, 16,
    False), "ngram-3@auto" ("ngram", 3, None, True), "none" ("none", 0, None, False)."""
    name, _, limit = method.partition("@")
    kind, _, k = name.partition("-")
    adaptive = limit == "auto"
    return kind, int(k or 0), int(limit) if limit and not adaptive else None, adaptive
