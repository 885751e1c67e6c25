"""Shared speculative engines for the tests: one target runner per family (every K shares it, so
the prefill-only variant compiles once), one draft runner per (draft, family), one runner per
family of the preset with a random MTP head, `Oracle`, a drafter that proposes a known
continuation with planned mistakes, and `CoinGate`, a draft gate that drafts in random steps."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jmamba
from jmamba.config import Ffn, Mixer
from runtime.core.buckets import Bucket
from runtime.core.engine_args import EngineArgs
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.core.schedule import Schedule
from runtime.core.speculative_config import SpeculativeConfig
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine
from runtime.speculative.draft_model import draft_engine_args
from runtime.speculative.verify import check_verifiable, with_drafts
from tests.compiled import per_module
from tests.runtime.conftest import (
    MAX_NUM_SEQS,
    base_config,
    model_and_runner,
    model_with_eos,
    naive_greedy,
)

MAX_K = 4
SPEC_SLOTS = 1 + MAX_NUM_SEQS * (2 + MAX_K)  # the default slot count at K = MAX_K
DRAFT_PRESET = "mamba2"  # the small draft model: a random mamba2 of the shared vocabulary (256)


def spec_config(family: str, speculative: SpeculativeConfig, **options) -> EngineArgs:
    return dataclasses.replace(
        base_config(family), num_slots=SPEC_SLOTS, speculative=speculative, **options
    )


@per_module
def spec_runner(family: str, ranks: int = 1) -> ModelRunner:
    model, _ = model_and_runner(family)
    config = spec_config(family, SpeculativeConfig("ngram", MAX_K), data_parallel_size=ranks)
    return ModelRunner(model, resolve_config(model, config), keep_logits=True)


NOISE = 0.05  # relative weight noise of a 'noisy:' draft: about half of its drafts are accepted


@per_module
def draft_model(name: str) -> nnx.Module:
    """'target:<family>' is the family's target model itself; 'noisy:<family>' the target with
    every weight scaled by 1 + NOISE * N(0, 1) (it agrees with the target often but not always,
    so drafts are accepted in part); else a preset with seed 1."""
    kind, _, family = name.partition(":")
    if kind == "target":
        return model_and_runner(family)[0]
    if kind == "noisy":
        return perturbed(model_and_runner(family)[0], NOISE, seed=1)
    return jmamba.HybridLM(jmamba.presets.tiny(name), rngs=nnx.Rngs(1))


def perturbed(model: nnx.Module, scale: float, seed: int) -> nnx.Module:
    """A copy of `model` with every floating-point weight w scaled by 1 + scale * N(0, 1)."""
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [
        w * (1 + scale * jax.random.normal(key, w.shape, w.dtype))
        if jnp.issubdtype(w.dtype, jnp.floating)
        else w
        for w, key in zip(leaves, keys, strict=True)
    ]
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, noisy))


# The MTP heads given to the presets: Qwen3-Next's (an attention layer with the model's MoE) and
# NemotronH's (an attention block, then an MLP block).
HEADS = {
    "nemotron_h": ((Mixer.ATTENTION, Mixer.NONE), (Ffn.NONE, Ffn.MLP)),
    "qwen3_next": ((Mixer.ATTENTION,), (Ffn.MOE,)),
}


@per_module
def mtp_model(family: str, eos_token_ids: tuple[int, ...] | None = None) -> nnx.Module:
    """The family's preset model with a random MTP head: the head's parameters are drawn after
    the model's, so its target is the preset's model and `naive_greedy` its reference. With
    `eos_token_ids`, shapes only (an engine on a shared runner reads nothing but its config)."""
    mixers, ffns = HEADS[family]
    config = dataclasses.replace(jmamba.presets.tiny(family), mtp_mixers=mixers, mtp_ffns=ffns)
    if eos_token_ids is None:
        return jmamba.HybridLM(config, rngs=nnx.Rngs(0))
    config = dataclasses.replace(config, eos_token_ids=eos_token_ids)
    return nnx.eval_shape(lambda: jmamba.HybridLM(config, rngs=nnx.Rngs(0)))


@per_module
def mtp_runner(family: str, ranks: int = 1) -> ModelRunner:
    config = spec_config(family, SpeculativeConfig("mtp", MAX_K), data_parallel_size=ranks)
    model = mtp_model(family)
    return ModelRunner(model, resolve_config(model, config))


@per_module
def draft_runner(name: str, family: str, ranks: int = 1) -> ModelRunner:
    config = spec_config(family, SpeculativeConfig("draft_model", MAX_K), data_parallel_size=ranks)
    target = resolve_config(model_and_runner(family)[0], config)
    draft = draft_model(name)
    return ModelRunner(draft, resolve_config(draft, draft_engine_args(target)))


def spec_engine(
    family: str,
    method: str,
    k: int,
    draft: str = DRAFT_PRESET,
    ranks: int = 1,
    eos_token_ids: tuple[int, ...] | None = None,
    max_batch_size: int | None = None,
    adaptive: bool = False,
    **options,
) -> Engine:
    """A fresh speculative engine on the shared runners; `eos_token_ids` replaces the model's EOS
    ids, `max_batch_size` and `adaptive` are the `SpeculativeConfig` fields, `options` the
    EngineArgs fields."""
    model, _ = model_and_runner(family)
    if eos_token_ids is not None:
        model = model_with_eos(family, tuple(eos_token_ids))
    # 1-grams too: random models rarely repeat longer n-grams of their own output
    speculative = SpeculativeConfig(
        method,
        k,
        prompt_lookup_min=1,
        prompt_lookup_max=3,
        max_batch_size=max_batch_size,
        adaptive=adaptive,
    )
    config = spec_config(family, speculative, data_parallel_size=ranks, **options)
    if method == "mtp":
        eos = None if eos_token_ids is None else tuple(eos_token_ids)
        return Engine(mtp_model(family, eos), config, runner=mtp_runner(family, ranks))
    if method != "draft_model":
        return Engine(model, config, runner=spec_runner(family, ranks))
    return Engine(
        model,
        config,
        runner=spec_runner(family, ranks),
        draft_model=draft_model(draft),
        draft_runner=draft_runner(draft, family, ranks),
    )


def assert_serves_naive_greedy(
    engine: Engine, family: str, prompts: list[list[int]], lengths: list[int]
) -> None:
    """Serve greedy requests of `lengths` tokens to completion: each request's tokens equal the
    naive greedy loop's."""
    for prompt, n in zip(prompts, lengths, strict=True):
        engine.add_request(prompt, SamplingParams(max_tokens=n))
    outputs = {}
    while engine.has_unfinished:
        outputs |= {o.request_id: o for o in engine.step()}
    for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
        assert outputs[str(i)].token_ids == naive_greedy(family, prompt, n), i


class CoinGate:
    """A draft gate that drafts in a random half of the steps (seeded): whatever the sequence of
    drafting and plain steps, an engine serves the same tokens."""

    uniform = False

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def drafts(self, num_running: int) -> bool:
        return bool(self.rng.integers(2))

    def observe(self, num_tokens: int, seconds: float, drafted: bool) -> None:
        """Learns nothing."""


class Oracle:
    """A drafter that knows each request's continuation (`truth[request_id]`, its outputs from
    index 0) and proposes its next tokens with planned mistakes: each time, `plan` picks how many
    drafts to propose and how many of them are right (the rest are off by one). It records what
    it planned, so a test can compute how many drafts the engine must accept."""

    total_compile_seconds = 0.0

    def __init__(self, truth: dict[str, list[int]], k: int, seed: int = 0) -> None:
        self.truth, self.k = truth, k
        self.rng = np.random.default_rng(seed)
        self.expected_accepted = 0
        self.num_drafted = 0
        self._right: dict[Request, int] = {}
        self._proposals: dict[Request, list[int]] = {}

    def check(self, params: SamplingParams) -> None:
        check_verifiable(params)

    def num_wanted(self, request: Request) -> int:
        outputs = request.output_token_ids
        truth = self.truth[request.request_id]
        follows = truth[: len(outputs)] == outputs
        n = int(self.rng.integers(0, self.k + 1))
        right = int(self.rng.integers(0, n + 1)) if follows else 0
        nxt = truth[len(outputs) : len(outputs) + n] if follows else []
        nxt = nxt + [0] * (n - len(nxt))  # past the known continuation: a guess
        drafts = nxt[:right] + [(t + 1) % 256 for t in nxt[right:]]
        self._proposals[request] = drafts
        self._right[request] = min(right, len(truth) - len(outputs))
        return n

    def propose(self, schedules: list[Schedule], bucket: Bucket) -> list[Schedule]:
        for schedule in schedules:
            for item in schedule.decodes:
                granted = item.num_tokens - 1
                self.num_drafted += granted
                self.expected_accepted += min(self._right.pop(item.request, 0), granted)
        proposals, self._proposals = self._proposals, {}
        return [with_drafts(schedule, proposals) for schedule in schedules]

    def dispatched(
        self, schedule: Schedule, bucket: Bucket, moved: list[bool], drafted: bool
    ) -> None:
        """Proposes from the truth, not from the step."""

    def observe(self, schedule: Schedule, bucket: Bucket, drafts: object) -> None:
        """Learns nothing from a step."""

    def release_done(self) -> None:
        self._right = {r: n for r, n in self._right.items() if not r.is_finished}

    def warmup(self) -> None:
        pass


@per_module
def trained_runner() -> tuple[nnx.Module, ModelRunner]:
    """The trained stdlib preset (vocabulary 257, chunk size 64) with an ngram engine's pools."""
    model = jmamba.load_pretrained(jmamba.presets.path("stdlib"))
    budget = 128
    speculative = SpeculativeConfig("ngram", MAX_K, prompt_lookup_min=1, prompt_lookup_max=3)
    config = EngineArgs(
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=budget,
        max_model_len=128,
        decode_row_buckets=(MAX_NUM_SEQS,),
        prefill_token_buckets=(budget,),
        prefill_row_buckets=(MAX_NUM_SEQS,),
        validate_inputs=True,
        speculative=speculative,
    )
    return model, ModelRunner(model, resolve_config(model, config))


def trained_engine() -> Engine:
    model, runner = trained_runner()
    return Engine(model, EngineArgs.of_config(runner.config), runner=runner)
