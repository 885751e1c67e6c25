"""`ModelRunner`: the model split once, one compiled step per bucket, caches donated.

The step is the pure function `(params, caches, inputs, sampling) -> (tokens, caches)`; sampling
runs inside it, so only N int32 token ids come back to the host each step. The runner makes no
policy decision: it runs whatever `StepBatch` it is given, in the bucket it is told, with the
sampler its `SamplingMode` asks for. One variant is compiled per (bucket, sampling mode).

Dispatch cost matters at small batch, so each call passes the parameters as a flat list of arrays
(flattening the nnx `State` runs Python code per variable, every call) and the step's inputs as one
packed int32 buffer (one host->device copy instead of one per field; see `runtime.packing`).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from runtime.buckets import Bucket
from runtime.builder import StepBatch, build_dummy
from runtime.config import EngineConfig
from runtime.packing import Layout, layout_of, pack, unpack
from runtime.sampler import sample
from runtime.sampling_inputs import SamplingMode

VariantKey = tuple[Bucket, SamplingMode]


def _step(
    graphdef: nnx.GraphDef,
    param_treedef: Any,
    keep_logits: bool,
    layout: Layout,
    mode: SamplingMode,
    param_leaves: list[jax.Array],
    caches: Any,
    packed: jax.Array,
) -> tuple[jax.Array, jax.Array | None, Any]:
    inputs, sampling = unpack(packed, layout)
    model = nnx.merge(graphdef, jax.tree.unflatten(param_treedef, param_leaves))
    logits, caches = model(inputs, caches)
    return sample(logits, sampling, mode), (logits if keep_logits else None), caches


class ModelRunner:
    """Holds params and caches; compiles and runs one step variant per (bucket, sampling mode).

    Attributes:
      caches: the device caches (replaced, not mutated, by every step: the old ones are donated).
      last_logits: [N, vocab] fp32 logits of the last step when `keep_logits`, else None.
      compile_seconds: time spent compiling, per (bucket, sampling mode).
    """

    def __init__(self, model: nnx.Module, config: EngineConfig, *, keep_logits: bool = False):
        self.config = config = config.resolved(model.config.chunk_size)
        self.graphdef, self.params = nnx.split(model)
        self._param_leaves, self._param_treedef = jax.tree.flatten(self.params)
        self.caches = model.init_caches(
            num_blocks=config.num_blocks, block_size=config.block_size, num_slots=config.num_slots
        )
        self.keep_logits = keep_logits
        self.last_logits: jax.Array | None = None
        self.compile_seconds: dict[VariantKey, float] = {}
        self._jitted = jax.jit(_step, static_argnums=(0, 1, 2, 3, 4), donate_argnames=("caches",))
        self._compiled: dict[VariantKey, Any] = {}
        self._layouts: dict[VariantKey, Layout] = {}

    @property
    def num_variants(self) -> int:
        """How many step variants are compiled so far."""
        return len(self._compiled)

    @property
    def variants(self) -> list[VariantKey]:
        """The (bucket, sampling mode) of every compiled step variant."""
        return list(self._compiled)

    def run(self, bucket: Bucket, batch: StepBatch) -> np.ndarray:
        """Run one step; returns each scheduled request's sampled token, [len(sample_rows)]."""
        key = (bucket, batch.mode)
        compiled = self._compiled.get(key) or self._compile(key, batch)
        packed = pack((batch.inputs, batch.sampling), self._layouts[key])
        tokens, logits, self.caches = compiled(self._param_leaves, self.caches, packed)
        self.last_logits = logits
        return np.asarray(tokens)[batch.sample_rows]

    def warmup(self, buckets: list[Bucket]) -> None:
        """Compile `buckets`, running each once on an all-padding step (changes no live slot)."""
        for bucket in buckets:
            self.run(bucket, build_dummy(bucket, max_blocks=self.config.max_blocks_per_seq))

    def _compile(self, key: VariantKey, batch: StepBatch) -> Any:
        start = time.perf_counter()
        layout = layout_of((batch.inputs, batch.sampling))
        lower = functools.partial(self._jitted.lower, self.graphdef, self._param_treedef,
                                  self.keep_logits, layout, batch.mode)  # fmt: skip
        packed = pack((batch.inputs, batch.sampling), layout)
        compiled = lower(self._param_leaves, self.caches, packed).compile()
        self._layouts[key] = layout
        self.compile_seconds[key] = time.perf_counter() - start
        self._compiled[key] = compiled
        return compiled
