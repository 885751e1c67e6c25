"""`LLM`: load a model (built-in preset or checkpoint directory) and generate for many prompts.

Plain `tqdm` (not `tqdm.auto`): in Jupyter, `tqdm.auto` wants ipywidgets and warns without them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from runtime import compile_cache
from runtime.config import EngineConfig
from runtime.engine import Engine, StepStats
from runtime.prefix_cache import PrefixCacheStats
from runtime.request import RequestOutput, StreamDelta
from runtime.sampling_params import SamplingParams

PRESET_PREFIX = "tiny-"
DEFAULT_MODEL = "tiny-stdlib"  # the trained preset: it writes Python-looking text


def load_model(model: str, seed: int = 0, dtype: str = "auto") -> tuple[Any, Any]:
    """Return (HybridLM, tokenizer or None) for a preset ("tiny-<name>") or an HF directory.

    A trained preset loads from its checkpoint directory like any checkpoint; a random-weight
    preset is built from `seed` and gets the presets' byte-level tokenizer. `dtype` is "auto"
    (the checkpoint's; float32 for a random-weight preset), "float32" or "bfloat16".
    """
    from flax import nnx

    import jmamba
    from jmamba.weights import cast, resolve_dtype

    resolve_dtype(dtype)  # a bad name fails before anything loads
    if model.startswith(PRESET_PREFIX) and not Path(model).exists():
        name = model.removeprefix(PRESET_PREFIX)
        if name not in jmamba.presets.names():
            raise ValueError(f"unknown preset {model!r}; built-in presets are {preset_names()}")
        if name in jmamba.presets.trained_names():
            path = jmamba.presets.path(name)
            return jmamba.load_pretrained(path, dtype), load_tokenizer(path)
        random = jmamba.HybridLM(jmamba.presets.tiny(name), rngs=nnx.Rngs(seed))
        return cast(random, dtype), _byte_tokenizer()
    path = Path(model)
    if not path.is_dir():
        raise ValueError(
            f"model={model!r} is neither a checkpoint directory nor a preset {preset_names()}"
        )
    if not (path / "config.json").is_file():
        raise ValueError(f"checkpoint directory {model!r} has no config.json")
    if not list(path.glob("*.safetensors")):
        raise ValueError(f"checkpoint directory {model!r} has no *.safetensors files")
    return jmamba.load_pretrained(path, dtype), load_tokenizer(path)


def preset_names() -> list[str]:
    import jmamba

    return [PRESET_PREFIX + name for name in jmamba.presets.names()]


def load_tokenizer(path: Path) -> Any:
    """A `tokenizers.Tokenizer` from `path/tokenizer.json`, or None (no file or no package)."""
    if not (path / "tokenizer.json").is_file():
        return None
    try:
        import tokenizers
    except ImportError:
        return None
    return tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))


def _byte_tokenizer() -> Any:
    """The presets' byte-level tokenizer, or None without the `tokenizers` package."""
    from jmamba.tokenizer import byte_tokenizer

    try:
        return byte_tokenizer()
    except ImportError:
        return None


class LLM:
    """Offline generation: `LLM("tiny-stdlib").generate(["def "], SamplingParams())`.

    Attributes:
      model / tokenizer: the loaded `HybridLM` and its `tokenizers.Tokenizer` (or None).
      engine: the `Engine` serving it (step it directly, or look inside it).
      load_seconds: time spent loading the model.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        dtype: str = "auto",
        warmup: bool | str = False,
        async_scheduling: bool | None = None,
        **engine_options,
    ):
        """`model` is a preset name ("tiny-stdlib", see `preset_names()`) or a HF checkpoint
        directory; `dtype` is "auto" (the checkpoint's), "float32" or "bfloat16"; `warmup`
        compiles step variants now instead of on first use, with a progress bar: True the
        decode-only ones, "all" every one the config can use; `async_scheduling` (the
        `EngineConfig` field) None: on unless speculative decoding is (step N + 1 is scheduled
        while N runs, same outputs); `engine_options` are the other `EngineConfig` fields
        (max_num_seqs, max_model_len, prefix_caching, state_block_size, max_cached_states, ...).
        JAX's persistent compilation cache is turned on (`runtime.compile_cache`;
        JMAMBA_COMPILE_CACHE=off)."""
        if warmup not in (False, True, "all"):
            raise ValueError(f"warmup={warmup!r} must be False, True (decode variants) or "
                             "'all' (every variant)")  # fmt: skip
        fields = set(EngineConfig.__dataclass_fields__)
        unknown = sorted(set(engine_options) - fields)
        if unknown:
            raise ValueError(f"unknown engine options {unknown}; known: {sorted(fields)}")
        if async_scheduling is None:
            async_scheduling = engine_options.get("speculative") is None
        config = EngineConfig(**engine_options, async_scheduling=async_scheduling)
        compile_cache.enable()
        start = time.perf_counter()
        self.name = model
        self.model, self.tokenizer = load_model(model, seed=config.seed, dtype=dtype)
        self.load_seconds = time.perf_counter() - start
        self.engine = Engine(self.model, config, tokenizer=self.tokenizer)
        if warmup:
            self.engine.warmup(prefill=warmup == "all", progress=True)

    @property
    def stats(self) -> StepStats:
        """The engine's counters: steps, host and device seconds, per-rank tokens and prefix
        cache counters."""
        return self.engine.stats

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Prefix cache counters summed over the ranks (lookups, hits = requests that started
        past token 0, hit_tokens = prompt tokens skipped, evictions); None when caching is off."""
        return self.engine.prefix_cache_stats

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
                    bar.set_postfix_str(f"{num_out} tokens out, "
                                        f"{num_out / (time.perf_counter() - start):.1f} tok/s",
                                        refresh=False)  # fmt: skip
                    bar.update(1)
        return [outputs[i] for i in ids]

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
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not isinstance(sampling_params, Sequence):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"{len(sampling_params)} sampling_params for {len(prompts)} prompts")
        checked = [self.engine.check_request(self._encode(prompt), params)
                   for prompt, params in zip(prompts, sampling_params, strict=True)]  # fmt: skip
        if self.tokenizer is None and any(params.stop for _, params in checked):
            raise ValueError("stop strings need a tokenizer: this model directory has none")
        return [self.engine.add_request(prompt, params) for prompt, params in checked]

    def _encode(self, prompt: str | Sequence[int]) -> Sequence[int]:
        if not isinstance(prompt, str):
            return prompt  # token ids, checked by the engine
        if self.tokenizer is None:
            raise ValueError(f"string prompts need a tokenizer: {self.name!r} has no "
                             "tokenizer.json; pass token-id lists instead")  # fmt: skip
        return self.tokenizer.encode(prompt).ids

    def __repr__(self) -> str:
        num_params = self.engine.runner.num_params
        tokenizer = "none" if self.tokenizer is None else f"{self.tokenizer.get_vocab_size()} ids"
        return (
            f"LLM({self.name!r}, {self.model.config.architecture}, "
            f"{num_params / 1e6:.2f}M params, {self.model.dtype}, tokenizer={tokenizer}, "
            f"max_num_seqs={self.engine.config.max_num_seqs}, "
            f"max_model_len={self.engine.config.max_model_len})"
        )
