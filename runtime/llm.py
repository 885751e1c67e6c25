"""`LLM`: load a model (built-in preset or checkpoint directory) and generate for many prompts.

Plain `tqdm` (not `tqdm.auto`): in Jupyter, `tqdm.auto` wants ipywidgets and warns without them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
from tqdm import tqdm
from typing_extensions import TypeIs  # typing's own from Python 3.13

from jmamba.loading import checkpoint_dir, load_model, load_model_shapes, model_tokenizer
from jmamba.model import HybridLM
from jmamba.text.chat_template import ChatTemplate, load_chat_template
from runtime.core.config import DEFAULT_DECODE_STEPS
from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.core.speculative_config import SpeculativeConfig
from runtime.device import compile_cache
from runtime.device.placement import CheckpointShards, ParamSource, place_params
from runtime.engine import Engine
from runtime.observe.step_stats import StepStats
from runtime.outputs.request_output import RequestOutput, StreamDelta
from runtime.prefix_cache import PrefixCacheStats
from runtime.ranks.group import RankGroup

DEFAULT_MODEL = "tiny-stdlib"  # the trained preset: it writes Python-looking text
Conversation = Sequence[Mapping[str, str]]  # [{"role": ..., "content": ...}, ...]


@dataclasses.dataclass(frozen=True)
class ModelSummary:
    """What a repr or a report says of the served model."""

    architecture: str
    num_params: int
    dtype: Any

    @classmethod
    def of(cls, model: HybridLM, num_params: int) -> ModelSummary:
        return cls(model.config.architecture, num_params, model.dtype)


class LLM:
    """Offline generation: `LLM("tiny-stdlib").generate(["def "], SamplingParams())`.

    Attributes:
      model / tokenizer: the loaded `HybridLM` (parameters in host memory; shapes only for a
        checkpoint directory on tensor_parallel_size > 1, whose shards the runner reads from
        the files as slices; None when rank processes hold it) and its
        `tokenizers.Tokenizer` (or None).
      summary: the model's architecture, parameter count and dtype (`ModelSummary`).
      engine: the `Engine` serving it (step it directly, or look inside it), or with rank
        processes the `RankGroup` that fronts them.
      load_seconds: time spent loading the model and placing its parameters on the devices.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        dtype: str = "auto",
        warmup: bool | str = False,
        async_scheduling: bool | None = None,
        decode_steps: int = DEFAULT_DECODE_STEPS,
        rank_processes: bool = True,
        **engine_options,
    ):
        """`model` is a preset name ("tiny-stdlib", see `preset_names()`) or a HF checkpoint
        directory; `dtype` is "auto" (the checkpoint's), "float32" or "bfloat16"; `warmup`
        compiles step variants now instead of on first use, with a progress bar: True the
        decode-only ones, "all" every one the config can use; `async_scheduling` (the
        `EngineArgs` field) None: on unless speculative decoding drafts on the host in every
        step (step N + 1 is scheduled while N runs, same outputs); `decode_steps` (the
        `EngineArgs` field) decode steps one device program runs while every request decodes
        (same outputs; 1: a program a step); `rank_processes`: with data_parallel_size > 1,
        a process per rank (`runtime.ranks`: each loads the model and steps on its own
        devices; this process routes and reads outputs) or, False, one program over every
        rank's devices in this process; `engine_options` are the other
        `EngineArgs` fields (max_num_seqs, max_model_len, prefix_caching, state_block_size,
        max_cached_states, data_parallel_size, tensor_parallel_size, kv_cache_dtype,
        state_dtype, ...). The model's parameters stay in host memory (`model`); the engine's
        runner copies each device's shard of them to it.
        JAX's persistent compilation cache is turned on (`runtime.device.compile_cache`;
        JMAMBA_COMPILE_CACHE=off)."""
        if warmup not in (False, True, "all"):
            raise ValueError(
                f"warmup={warmup!r} must be False, True (decode variants) or 'all' (every variant)"
            )
        fields = set(EngineArgs.__dataclass_fields__)
        unknown = sorted(set(engine_options) - fields)
        if unknown:
            raise ValueError(f"unknown engine options {unknown}; known: {sorted(fields)}")
        if async_scheduling is None:
            spec = SpeculativeConfig.of(engine_options.get("speculative"))
            async_scheduling = spec is None or spec.has_asynchronous_steps
        args = EngineArgs(
            **engine_options, async_scheduling=async_scheduling, decode_steps=decode_steps
        )
        compile_cache.enable()
        start = time.perf_counter()
        self.name = model
        self.model: HybridLM | None
        self.engine: Engine | RankGroup
        self.chat_template = load_chat_template(checkpoint_dir(model))
        # A multi-host run (jax.distributed) is one mesh over its processes already.
        if args.data_parallel_size > 1 and rank_processes and not jax.distributed.is_initialized():
            self._start_ranks(model, dtype, warmup, args, engine_options)
        else:
            self._load_here(model, dtype, args)
        self.load_seconds = time.perf_counter() - start
        if warmup and isinstance(self.engine, Engine):  # rank processes warmed up themselves
            self.engine.warmup(prefill=warmup == "all", progress=True)

    def _load_here(self, model: str, dtype: str, args: EngineArgs) -> None:
        """Load the model into this process and build its `Engine` over every rank's devices."""
        start = time.perf_counter()
        directory = checkpoint_dir(model)
        if args.tensor_parallel_size > 1 and directory is not None and directory.is_dir():
            # Shapes only: the runner reads each device's shard from the files as slices.
            self.model, self.tokenizer = load_model_shapes(directory, dtype)
            params: ParamSource = CheckpointShards(directory)
        else:  # on the host: the runner places each device's tensor-parallel shard of it
            self.model, self.tokenizer = load_model(model, seed=args.seed, dtype=dtype, host=True)
            params = place_params
        self.checkpoint_seconds = time.perf_counter() - start  # read, on the host
        # The runner logs its pools (`runtime.device.footprint.log_pools`, INFO).
        self.engine = Engine(self.model, args, tokenizer=self.tokenizer, params=params)
        self.summary = ModelSummary.of(self.model, self.engine.runner.num_params)

    def _start_ranks(
        self, model: str, dtype: str, warmup: bool | str, args: EngineArgs, options: dict
    ) -> None:
        """Start a process per data-parallel rank (`runtime.ranks`); this process keeps the
        tokenizer and the front of the engine only (`model` is None here)."""
        self.tokenizer = model_tokenizer(model)  # a bad model name fails here, before any rank
        rank_options = dict(
            options, async_scheduling=args.async_scheduling, decode_steps=args.decode_steps
        )
        self.engine = group = RankGroup.start(
            model,
            num_ranks=args.data_parallel_size,
            dtype=dtype,
            warmup=warmup,
            options=rank_options,
        )
        self.model = None
        info = group.info
        self.checkpoint_seconds = info.checkpoint_seconds  # rank 0's; the others read beside it
        self.summary = ModelSummary(info.model_config.architecture, info.num_params, info.dtype)

    @property
    def setup_seconds(self) -> dict[str, float]:
        """Where the engine's set-up went ("parameters" placed, "pools" made): this process's
        runner's, or rank 0's with rank processes."""
        if isinstance(self.engine, RankGroup):
            return self.engine.info.setup_seconds
        return self.engine.runner.setup_seconds

    @property
    def local_engine(self) -> Engine:
        """The `Engine` in this process; ValueError when rank processes hold the engines (build
        the `LLM` with rank_processes=False for one engine over every rank's devices)."""
        if not isinstance(self.engine, Engine):
            raise ValueError(
                "this LLM runs a process per data-parallel rank: pass rank_processes=False for "
                "an engine in this process"
            )
        return self.engine

    @property
    def stats(self) -> StepStats:
        """The engine's counters: steps, host and device seconds, per-rank tokens and prefix
        cache counters."""
        return self.engine.stats

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Prefix cache counters summed over the ranks (lookups, hits = requests that started
        past token 0, hit_tokens = prompt tokens skipped, evictions); None when caching is off."""
        return self.engine.stats.prefix_cache

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt (strings need a tokenizer); outputs in prompt order.

        Every prompt is checked before any is queued: a bad one raises ValueError and queues none.
        """
        ids = self._add(prompts, sampling_params)
        outputs: dict[str, RequestOutput] = {}
        start, num_out = time.perf_counter(), 0
        with tqdm(total=len(ids), desc="generate", unit="req", disable=not use_tqdm) as bar:
            # any_unfinished, not our own count: in a multi-host run a process whose requests are
            # done keeps stepping (its ranks run dummy steps) while another process has work.
            while self.engine.any_unfinished():
                for output in self.engine.step():
                    outputs[output.request_id] = output
                    num_out += len(output.token_ids)
                    bar.set_postfix_str(
                        f"{num_out} tokens out, "
                        f"{num_out / (time.perf_counter() - start):.1f} tok/s",
                        refresh=False,
                    )
                    bar.update(1)
        return [outputs[i] for i in ids]

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Answer one conversation ([{"role", "content"}, ...]) or several: each is rendered
        with the checkpoint's chat template (`render_chat`) and generated for; outputs in order."""
        conversations = [messages] if _is_conversation(messages) else list(messages)
        prompts = [self.render_chat(conversation) for conversation in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def render_chat(self, messages: Conversation) -> str:
        """The prompt text of a conversation, the assistant's turn opened. ValueError when the
        checkpoint has no chat template or the template refuses the messages."""
        template = self.require_chat_template()
        return template.render([dict(m) for m in messages], add_generation_prompt=True)

    def require_chat_template(self) -> ChatTemplate:
        """The chat template, or a ValueError saying where one would be read from."""
        if self.chat_template is None:
            raise ValueError(
                f"{self.name!r} has no chat template (chat_template.jinja, or chat_template in "
                "tokenizer_config.json): send a plain prompt instead"
            )
        return self.chat_template

    def stream(
        self,
        prompts: str | Sequence[str] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[StreamDelta]:
        """Generate for every prompt, yielding each step's new tokens and text per request as
        they come (`StreamDelta`; a request's last one has `finished` and its `output`)."""
        self._add(prompts, sampling_params)
        yield from self.engine.stream()

    def _add(
        self,
        prompts: str | Sequence[str] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
    ) -> list[str]:
        """Check every prompt, then queue them all; returns their request ids."""
        items: list[str | Sequence[int]] = [prompts] if isinstance(prompts, str) else list(prompts)
        if not isinstance(sampling_params, Sequence):
            sampling_params = [sampling_params or SamplingParams()] * len(items)
        if len(sampling_params) != len(items):
            raise ValueError(f"{len(sampling_params)} sampling_params for {len(items)} prompts")
        checked = [
            self.engine.check_request(self._encode(prompt), params)
            for prompt, params in zip(items, sampling_params, strict=True)
        ]
        if self.tokenizer is None and any(params.stop for _, params in checked):
            raise ValueError("stop strings need a tokenizer: this model directory has none")
        return [self.engine.add_request(prompt, params) for prompt, params in checked]

    def _encode(self, prompt: str | Sequence[int]) -> Sequence[int]:
        if not isinstance(prompt, str):
            return prompt  # token ids, checked by the engine
        if self.tokenizer is None:
            raise ValueError(
                f"string prompts need a tokenizer: {self.name!r} has no "
                "tokenizer.json; pass token-id lists instead"
            )
        return self.tokenizer.encode(prompt).ids

    def __repr__(self) -> str:
        summary = self.summary
        tokenizer = "none" if self.tokenizer is None else f"{self.tokenizer.get_vocab_size()} ids"
        return (
            f"LLM({self.name!r}, {summary.architecture}, "
            f"{summary.num_params / 1e6:.2f}M params, {summary.dtype}, tokenizer={tokenizer}, "
            f"max_num_seqs={self.engine.config.max_num_seqs}, "
            f"max_model_len={self.engine.config.max_model_len}, "
            f"{self.engine.config.cache_dtypes.describe()})"
        )


def _is_conversation(messages: Conversation | Sequence[Conversation]) -> TypeIs[Conversation]:
    """Whether `messages` is one conversation (a list of message dicts), not a list of them."""
    return isinstance(messages, Sequence) and bool(messages) and isinstance(messages[0], Mapping)
