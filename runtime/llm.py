"""`LLM`: load a model (built-in preset or checkpoint directory) and generate for many prompts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from runtime.config import EngineConfig
from runtime.engine import Engine, StepStats
from runtime.prefix_cache import PrefixCacheStats
from runtime.request import RequestOutput
from runtime.sampling_params import SamplingParams

PRESET_PREFIX = "tiny-"
DEFAULT_MODEL = "tiny-nemotron_h"


def load_model(model: str, seed: int = 0) -> tuple[Any, Any]:
    """Return (HybridLM, tokenizer or None) for a preset ("tiny-<name>") or an HF directory.

    A trained preset loads from its checkpoint directory like any checkpoint; a random-weight
    preset is built from `seed` and gets the presets' byte-level tokenizer.
    """
    from flax import nnx

    import jmamba

    if model.startswith(PRESET_PREFIX) and not Path(model).exists():
        name = model.removeprefix(PRESET_PREFIX)
        if name not in jmamba.presets.names():
            raise ValueError(f"unknown preset {model!r}; built-in presets are {preset_names()}")
        if name in jmamba.presets.trained_names():
            path = jmamba.presets.path(name)
            return jmamba.load_pretrained(path), load_tokenizer(path)
        return jmamba.HybridLM(jmamba.presets.tiny(name), rngs=nnx.Rngs(seed)), _byte_tokenizer()
    path = Path(model)
    if not path.is_dir():
        raise ValueError(
            f"model={model!r} is neither a checkpoint directory nor a preset {preset_names()}"
        )
    if not (path / "config.json").is_file():
        raise ValueError(f"checkpoint directory {model!r} has no config.json")
    if not list(path.glob("*.safetensors")):
        raise ValueError(f"checkpoint directory {model!r} has no *.safetensors files")
    return jmamba.load_pretrained(path), load_tokenizer(path)


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
    """Offline generation: `LLM("tiny-nemotron_h").generate([[1, 2, 3]], SamplingParams())`."""

    def __init__(self, model: str = DEFAULT_MODEL, *, warmup: bool = True, **engine_options):
        """`engine_options` are `EngineConfig` fields (max_num_seqs, max_model_len,
        prefix_caching, state_block_size, max_cached_states, ...)."""
        fields = {f.name for f in dataclasses.fields(EngineConfig)}
        unknown = sorted(set(engine_options) - fields)
        if unknown:
            raise ValueError(f"unknown engine options {unknown}; known: {sorted(fields)}")
        config = EngineConfig(**engine_options)
        self.model, self.tokenizer = load_model(model, seed=config.seed)
        self.engine = Engine(self.model, config)
        if warmup:
            self.engine.warmup()

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
        prompts: Sequence[str] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt (strings need a tokenizer); outputs in prompt order.

        Every prompt is checked before any is queued: a bad one raises ValueError and queues none.
        """
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not isinstance(sampling_params, Sequence):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"{len(sampling_params)} sampling_params for {len(prompts)} prompts")
        checked = [self.engine.check_request(self._encode(prompt), params)
                   for prompt, params in zip(prompts, sampling_params, strict=True)]  # fmt: skip
        ids = [self.engine.add_request(prompt, params) for prompt, params in checked]
        outputs: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="generate", disable=not use_tqdm) as bar:
            # any_unfinished, not our own count: in a multi-host run a process whose requests are
            # done keeps stepping (its ranks run dummy steps) while another process has work.
            while self.engine.any_unfinished():
                for output in self.engine.step():
                    outputs[output.request_id] = self._decode(output)
                    bar.update(1)
        return [outputs[i] for i in ids]

    def _encode(self, prompt: str | Sequence[int]) -> Sequence[int]:
        if not isinstance(prompt, str):
            return prompt  # token ids, checked by the engine
        if self.tokenizer is None:
            raise ValueError("string prompts need a tokenizer.json in the model directory; "
                             "pass token-id lists instead")  # fmt: skip
        return self.tokenizer.encode(prompt).ids

    def _decode(self, output: RequestOutput) -> RequestOutput:
        if self.tokenizer is None:
            return output
        return dataclasses.replace(output, text=self.tokenizer.decode(output.token_ids))
