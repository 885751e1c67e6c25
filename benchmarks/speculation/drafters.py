"""The bench's drafters beyond the engine's own: a small random draft model of the bench model's
family, and the UPPER BOUND oracle that proposes a known continuation; and how a method's name
("mtp-2@16") reads."""

from __future__ import annotations

from flax import nnx

from benchmarks.engine.models import hf_config
from jmamba import HybridLM
from jmamba.families import from_hf_config
from jmamba.weights import cast
from runtime.core.buckets import Bucket
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.core.schedule import Schedule
from runtime.core.speculative_config import SpeculativeConfig
from runtime.speculative.verify import with_drafts


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


class OracleDrafter:
    """UPPER BOUND drafter: proposes the next K tokens of a known continuation (`truth`)."""

    total_compile_seconds = 0.0

    def __init__(self, truth: dict[str, list[int]], spec: SpeculativeConfig) -> None:
        self.truth, self.k = truth, spec.num_speculative_tokens
        self._proposals: dict[Request, list[int]] = {}

    def check(self, params: SamplingParams) -> None:
        """Serves what the bench asks."""

    def num_wanted(self, request: Request) -> int:
        done = len(request.output_token_ids)
        self._proposals[request] = self.truth[request.request_id][done : done + self.k]
        return len(self._proposals[request])

    def propose(self, schedules: list[Schedule], bucket: Bucket) -> list[Schedule]:
        """Nothing to run: each row with lanes feeds its proposal."""
        proposals, self._proposals = self._proposals, {}
        return [with_drafts(schedule, proposals) for schedule in schedules]

    def dispatched(
        self, schedule: Schedule, bucket: Bucket, moved: list[bool], drafted: bool
    ) -> None:
        """Proposes from the truth, not from the step."""

    def observe(self, schedule: Schedule, bucket: Bucket, drafts: object) -> None:
        """Learns nothing from a step."""

    def release_done(self) -> None:
        """Holds nothing past a step."""

    def warmup(self) -> None:
        """Compiles nothing."""


def parse_method(method: str) -> tuple[str, int, int | None, bool]:
    """(kind, K, max_batch_size, adaptive) of a method name: "mtp-2@16" is ("mtp", 2, 16,
    False), "ngram-3@auto" ("ngram", 3, None, True), "none" ("none", 0, None, False)."""
    name, _, limit = method.partition("@")
    kind, _, k = name.partition("-")
    adaptive = limit == "auto"
    return kind, int(k or 0), int(limit) if limit and not adaptive else None, adaptive
