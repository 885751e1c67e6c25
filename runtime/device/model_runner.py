"""`ModelRunner`: the model split once, one compiled SPMD step per variant, caches donated.

The step is the pure function `(params, caches, inputs, sampling) -> (tokens, caches)` of one
device, run on every device of the `(dp, tp)` mesh at once through `jax.shard_map`: each device
holds its tensor-parallel shard of the parameters (`placement.py`: stacked `[tp, ...]`, split over
`tp`, replicated over `dp`), every cache pool is split on its pool axis over `dp` (rank r owns
blocks / slots `[r * n, (r + 1) * n)` of the global array and sees them as its own `[0, n)`, 0
being its NULL entry) and on its head axis over `tp`, and the packed inputs are stacked
`[ranks, words]`, one row per rank, the same on every shard of the rank. A rank with no work is
given an all-padding row (the idle-rank dummy step): it runs the same program and, by
docs/architecture.md section 5 invariant 6, writes nothing but NULL entries. The shard model
reaches the other shards of its rank through its collectives (`jmamba.parallel.collectives`) and
returns the whole vocabulary's logits, so sampling is the same on every shard. With one device
this is a 1 x 1 mesh.

Sampling runs inside the step, so only int32 token ids (and, per speculative decode lane, whether
it accepted the next lane's draft; in a variant whose sampling mode asks for them, the sampled and
top-k log-probabilities) come back to the host. The runner makes no
policy decision: it runs whatever per-rank `StepBatch`es it is given, in the bucket and with the
sampler `SamplingMode` they carry. One variant is compiled per `VariantKey` (bucket, sampling
mode, whether it drafts, steps a program), or loaded instead from the `ExecutableStore` where an
earlier process compiled it (`executable_store.py`: a warm start traces nothing).

`dispatch` hands a step to the device and returns at once; `fetch` waits for it and returns what
it gave back, a `StepResult` (`run` does both). Every step hands its sampled tokens to the next on
the device, so an asynchronous engine can dispatch a step before the host has seen the tokens of
the one before (the builder's `token_sources` say which token lanes take one). A synchronous
engine's steps take none (every source NULL) and run the same program: synchronous and
asynchronous scheduling share their compiled steps.

Dispatch cost matters at small batch, so each call passes the parameters as a flat list of arrays
(flattening the nnx `State` runs Python code per variable, every call) and each rank's inputs as
one packed int32 row (one host->device copy for the whole step; see `packing.py`), and every
buffer the step reads or writes keeps its address from call to call (`step_buffers.py`), so XLA
launches the step's recorded CUDA graph as it is instead of recording it again.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import time
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from jmamba.model import HybridLM
from runtime.core.buckets import Bucket
from runtime.core.builder import build_dummy
from runtime.core.config import COMPILE_WORKERS, EngineConfig
from runtime.core.sampling_inputs import SamplingMode, TokenLogprobs
from runtime.core.step_batch import StepBatch
from runtime.core.warmup_progress import WarmupProgress
from runtime.device import compile_cache
from runtime.device.chaining import carried_depth, carried_tokens
from runtime.device.distributed import make_mesh
from runtime.device.executable_store import ExecutableStore, describe
from runtime.device.mtp_drafts import NoDeviceDrafts, device_drafter, served_model
from runtime.device.packing import Layout, layout_of, pack
from runtime.device.placement import ParamSource, cache_shardings, place_params, zero_caches
from runtime.device.spmd_step import StepSpec, spmd_step, with_output_buffers
from runtime.device.step_buffers import StepBuffers
from runtime.device.step_result import StepResult
from runtime.device.variants import DispatchedStep, Variant, VariantKey


class ModelRunner:
    """Holds params and caches on the mesh; compiles and runs one SPMD step per variant.

    Attributes:
      mesh: the `(dp, tp)` mesh (`config.data_parallel_size` ranks of
        `config.tensor_parallel_size` shards).
      caches: the device caches, every pool `[ranks * pool size, ...]` split by rank, and on its
        head axis by shard (replaced, not mutated, by every step: the old ones are donated).
      cache_shardings: each cache array's `NamedSharding`.
      drafter: what a drafting step drafts (`runtime.device.mtp_drafts`): the MTP head's drafts
        when the config speculates with method "mtp", else nothing; a step dispatched without
        drafts runs `NoDeviceDrafts`, the plain step.
      compile_seconds: time spent compiling (tracing, lowering, XLA), per `VariantKey`.
      load_seconds: time spent loading, per `VariantKey` loaded from `executables` instead.
    """

    def __init__(
        self,
        model: HybridLM,
        config: EngineConfig,
        *,
        keep_logits: bool = False,
        params: ParamSource = place_params,
        executables: ExecutableStore | None = None,
    ):
        """`config`: resolved for `model` (`runtime.device.memory.resolve_config`). `params` puts
        each device's parameter shard on it: `place_params` slices `model`'s values;
        `placement.RandomShards` makes random ones per shard (`model` shapes only).
        `executables`: where compiled variants are kept and loaded from (default: beside JAX's
        persistent compilation cache, none when it is off: `compile_cache.step_store`)."""
        model = served_model(model, config.speculative)
        self.config = config
        self.mesh = make_mesh(config.data_parallel_size, config.tensor_parallel_size)
        start = time.perf_counter()
        placed = params(model, self.mesh)
        placed_at = time.perf_counter()
        self.graphdef, self._param_treedef = placed.graphdef, placed.treedef
        self._param_leaves, self._num_params = placed.leaves, placed.num_params
        self._shard_model = placed.shard_model
        self.cache_shardings = cache_shardings(placed.shard_model, self.mesh)
        self.caches = zero_caches(
            placed.shard_model,
            self.mesh,
            num_blocks=config.num_blocks,
            block_size=config.block_size,
            num_slots=config.num_slots,
            dtypes=config.cache_dtypes,
        )
        jax.block_until_ready((placed.leaves, self.caches))
        # Seconds placing the parameters and making the zeroed pools (a server's start-up line).
        self.setup_seconds = {
            "parameters": placed_at - start,
            "pools": time.perf_counter() - placed_at,
        }
        self.keep_logits = keep_logits
        self.drafter = device_drafter(config.speculative)
        depth = carried_depth(self.drafter.num_drafts)
        self.buffers = StepBuffers(self.mesh, (depth, carried_tokens(config)))
        self.compile_seconds: dict[VariantKey, float] = {}
        self.load_seconds: dict[VariantKey, float] = {}  # variants loaded instead
        self.warmup_progress = WarmupProgress()  # `warmup`'s, read by other threads
        self.executables = executables or compile_cache.step_store()
        cache_specs = jax.tree.map(lambda s: s.spec, self.cache_shardings)
        self._jitted = jax.jit(  # traced per variant, then compiled `with_output_buffers`
            functools.partial(spmd_step, self.mesh, cache_specs),
            static_argnums=0,  # the `StepSpec`
            keep_unused=True,  # every argument a jaxpr input, as `with_output_buffers` passes them
        )
        self._compiled: dict[VariantKey, Any] = {}
        self._layouts: dict[VariantKey, Layout] = {}

    @property
    def num_variants(self) -> int:
        """How many step variants are compiled so far."""
        return len(self._compiled)

    @property
    def num_carried(self) -> int:
        """(1 + D) x C, the entries a token source of a carrying step may take: the previous
        step's tokens and its device drafts (`runtime.device.chaining`)."""
        return (1 + self.drafter.num_drafts) * self.buffers.carried.shape[2]

    @property
    def num_params(self) -> int:
        """Parameters of the model (the whole model, however many shards hold it)."""
        return self._num_params

    @property
    def total_compile_seconds(self) -> float:
        """Seconds spent compiling, all variants together."""
        return sum(self.compile_seconds.values())

    @property
    def variants(self) -> list[VariantKey]:
        """The `VariantKey` of every compiled step variant."""
        return list(self._compiled)

    @property
    def local_ranks(self) -> tuple[int, ...]:
        """Global ranks this process drives (all of them in a single-process run)."""
        return self.mesh.local_ranks

    def run(self, bucket: Bucket, batches: list[StepBatch]) -> StepResult:
        """Run one step; `batches[i]` is local rank i's inputs, all built for `bucket` with one
        `SamplingMode`."""
        return self.fetch(self.dispatch(bucket, batches))

    def dispatch(
        self,
        bucket: Bucket,
        batches: list[StepBatch],
        inputs: jax.Array | None = None,
        *,
        drafts: bool = True,
    ) -> DispatchedStep:
        """Hand one step to the device (compiling its variant first if needed) without waiting
        for it. The step takes the tokens of the step before through its `token_sources` (none
        where every source is NULL: a synchronous engine's steps) and hands its own to the next.
        `drafts`: whether the step drafts for the next (`drafter`); one without runs
        `NoDeviceDrafts`, the step of an engine without speculation. `inputs`: the batches
        already on the device (`device_inputs`), for benchmarks that replay one step."""
        key = self._variant(bucket, batches, drafts)
        self._compiled_for(key, batches[0])
        rows = self._rows(key, batches) if inputs is None else inputs
        return self._dispatch(key, [batches], rows)

    def dispatch_steps(
        self, bucket: Bucket, parts: list[list[StepBatch]], *, drafts: bool
    ) -> DispatchedStep:
        """Hand `len(parts)` steps to the device as one program (multi-step decode), step j with
        `parts[j]`, one batch per local rank, built for `bucket` with one sampling mode; each
        step after the first takes its tokens from the one before on the device. One part is
        `dispatch`. Several draft nothing."""
        if len(parts) == 1:
            return self.dispatch(bucket, parts[0], drafts=drafts)
        key = self._variant(bucket, parts[0], drafts, steps=len(parts))
        self._compiled_for(key, parts[0][0])  # before packing: compiling fixes the layout
        rows = np.hstack([self._rows(key, batches) for batches in parts])
        return self._dispatch(key, parts, rows)

    def _compiled_for(self, key: VariantKey, batch: StepBatch) -> Any:
        """Variant `key`'s executable, compiled first (from `batch`'s shapes) if needed."""
        return self._compiled.get(key) or self._compile(key, batch)

    def _dispatch(
        self, key: VariantKey, parts: list[list[StepBatch]], rows: np.ndarray | jax.Array
    ) -> DispatchedStep:
        """Run compiled variant `key` on its packed `rows` ([local ranks, steps x words], or
        already a device array)."""
        fresh = self.mesh.step_rows(rows) if isinstance(rows, np.ndarray) else rows
        packed = self.buffers.upload(key, fresh)
        self.caches, outputs, carried = self._compiled[key](
            self._param_leaves,
            self.caches,
            packed,
            self.buffers.outputs(key),
            self.buffers.carried,
        )
        self.buffers.keep(key, outputs, carried)
        outputs = self.buffers.download(outputs)
        for fetched in jax.tree.leaves(outputs):
            self.mesh.start_copy_to_host(fetched)
        return DispatchedStep(parts, *outputs)

    def device_inputs(self, bucket: Bucket, batches: list[StepBatch]) -> jax.Array:
        """The batches packed into the one device array `dispatch` sends (compiling the variant
        first if needed)."""
        key = self._variant(bucket, batches, drafts=True)
        self._compiled_for(key, batches[0])
        return self.mesh.global_array(self._rows(key, batches))

    def _variant(
        self, bucket: Bucket, batches: list[StepBatch], drafts: bool, steps: int = 1
    ) -> VariantKey:
        if len(batches) != len(self.local_ranks):
            raise ValueError(f"{len(batches)} batches for {len(self.local_ranks)} local ranks")
        mode = batches[0].mode
        if any(b.mode != mode for b in batches):
            raise ValueError(f"ranks' sampling modes differ: {[b.mode for b in batches]}")
        if steps > 1:  # several steps a program: none drafts
            drafts = False
        return VariantKey(bucket, mode, drafts and self.drafter.num_drafts > 0, steps)

    def fetch(self, step: DispatchedStep) -> StepResult:
        """Wait for a dispatched step (of one step); what it gave back, on the host."""
        if len(step.parts) != 1:
            raise ValueError(f"a program of {len(step.parts)} steps: fetch_steps")
        return StepResult.of_rows(*self._local_outputs(step), step.parts[0])

    def fetch_steps(self, step: DispatchedStep) -> list[StepResult]:
        """Wait for a dispatched program; what each of its steps gave back, in order."""
        if len(step.parts) == 1:
            return [self.fetch(step)]
        tokens, logprobs, logits = self._local_outputs(step)
        return [
            StepResult.of_rows(
                tokens[:, j],
                None if logprobs is None else TokenLogprobs(*(a[:, j] for a in logprobs)),
                None if logits is None else logits[:, j],
                batches,
            )
            for j, batches in enumerate(step.parts)
        ]

    def _local_outputs(
        self, step: DispatchedStep
    ) -> tuple[np.ndarray, TokenLogprobs[np.ndarray] | None, np.ndarray | None]:
        """This process's ranks' rows of the program's outputs (waiting for them)."""
        rows = self.mesh.local_rows
        logprobs = step.token_logprobs
        return (
            rows(step.tokens),
            None if logprobs is None else TokenLogprobs(*(rows(a) for a in logprobs)),
            None if step.logits is None else rows(step.logits),
        )

    def warmup(
        self,
        buckets: list[Bucket],
        *,
        modes: tuple[SamplingMode, ...] = (SamplingMode(),),
        drafts: bool = True,
        num_steps: int = 1,
        progress: bool = False,
        workers: int = COMPILE_WORKERS,
    ) -> None:
        """Compile (or load) `buckets` in each sampling mode of `modes` (`drafts`: as `dispatch`
        takes it; `num_steps`: programs of that many steps, as `dispatch_steps` runs them),
        then run each once on all-padding steps (which change no live slot and feed no token);
        `progress` shows a bar with the compile seconds so far; `warmup_progress` counts each
        variant as it is ready.

        Variants stored in `executables` load in `workers` threads at once; the others are
        lowered one by one (Python, under the GIL), each handed to a compiling thread as soon as
        it is lowered (XLA compiles without the GIL), so each variant's `compile_seconds` is its
        own and their sum can exceed the wall time of the warm-up."""
        dummies = {bucket: self._dummy(bucket) for bucket in buckets}
        steps = [
            (bucket, dataclasses.replace(dummies[bucket], mode=mode))
            for bucket in buckets
            for mode in modes
        ]
        ranks = len(self.local_ranks)
        todo = {self._variant(b, [batch] * ranks, drafts, num_steps): batch for b, batch in steps}
        self.warmup_progress.ready(sum(key in self._compiled for key in todo))
        todo = {key: batch for key, batch in todo.items() if key not in self._compiled}
        with tqdm(total=len(todo), desc="compile", unit="variant", disable=not progress) as bar:
            with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
                prepared = {key: self._prepare(key, batch) for key, batch in todo.items()}
                loads = {key: pool.submit(self._load, key, v) for key, v in prepared.items()}
                futures = []
                for key, load in loads.items():  # each compiles while the next is lowered
                    if load.result() is None:
                        lowered = self._lower(key, prepared[key])
                        compiling = pool.submit(self._finish_compile, key, prepared[key], *lowered)
                        futures.append(compiling)
                    else:
                        self.warmup_progress.ready(loaded=True)
                        bar.update()
                for future in concurrent.futures.as_completed(futures):
                    future.result()
                    self.warmup_progress.ready(compiled=True)
                    bar.update()
                    bar.set_postfix_str(f"{self.total_compile_seconds:.1f} s compiling")
        for bucket, batch in steps:
            parts = [[batch] * ranks] * num_steps
            self.fetch_steps(self.dispatch_steps(bucket, parts, drafts=drafts))

    def _dummy(self, bucket: Bucket) -> StepBatch:
        return build_dummy(
            bucket,
            max_blocks=self.config.max_blocks_per_seq,
            state_block_size=self.config.boundary_block_size,
            chain_width=self.config.decode_width,
            vocab_size=self.config.vocab_size,
        )

    def _rows(self, key: VariantKey, batches: list[StepBatch]) -> np.ndarray:
        """The batches packed, one row per local rank."""
        layout = self._layouts[key]
        return np.stack([pack(self._packed_tree(b, key), layout) for b in batches])

    def _compile(self, key: VariantKey, batch: StepBatch) -> Any:
        """Variant `key`'s executable: loaded from `executables`, else traced and compiled
        (then stored)."""
        variant = self._prepare(key, batch)
        loaded = self._load(key, variant)
        return loaded or self._finish_compile(key, variant, *self._lower(key, variant))

    def _prepare(self, key: VariantKey, batch: StepBatch) -> Variant:
        """What compiling or loading variant `key` starts from (its layout registered)."""
        self._layouts[key] = layout_of(self._packed_tree(batch, key))
        rows = self._rows(key, [batch] * len(self.local_ranks))
        packed = self.mesh.global_array(np.tile(rows, (1, key.steps)))
        spec = StepSpec(
            graphdef=self.graphdef,
            param_treedef=self._param_treedef,
            block_size=self.config.block_size,
            keep_logits=self.keep_logits,
            batch_invariant=self.config.batch_invariant,
            layout=self._layouts[key],
            mode=key.mode,
            drafter=self.drafter if key.drafts else NoDeviceDrafts(),
            steps=key.steps,
        )
        own = dataclasses.replace(spec, graphdef=None, param_treedef=None)  # the rest: shared
        return Variant(spec, packed, describe(own, packed) + self._shared_description)

    @functools.cached_property
    def _shared_description(self) -> str:
        """What every variant's store key shares (`executable_store.describe`): the model's
        graph definition and the parameters', caches' and carried array's shapes and shardings,
        described once, not per variant (its graphdef alone is tens of kB of text)."""
        arguments = (self._param_leaves, self.caches, self.buffers.carried)
        return describe((self.graphdef, self._param_treedef), arguments)

    def _load(self, key: VariantKey, variant: Variant) -> Any | None:
        """Variant `key`'s stored executable, its output buffers made; None if not stored."""
        start = time.perf_counter()
        loaded = self.executables.load(variant.description, list(self.mesh.mesh.devices.flat))
        if loaded is not None:
            _, output_shapes, _ = loaded.out_info  # (caches, StepOutputs, carried)
            self.buffers.add_variant(key, variant.packed, output_shapes)
            self.load_seconds[key] = time.perf_counter() - start
            self._compiled[key] = loaded
        return loaded

    def _lower(self, key: VariantKey, variant: Variant) -> tuple[Any, float]:
        """The variant traced and lowered (its output buffers registered): (lowered, the
        seconds it took)."""
        start = time.perf_counter()
        carried = self.buffers.carried
        traced = self._jitted.trace(
            variant.spec, self._param_leaves, self.caches, variant.packed, carried
        )
        _, output_shapes, _ = traced.out_info  # (caches, StepOutputs, carried)
        outputs = self.buffers.add_variant(key, variant.packed, output_shapes)
        lowered = with_output_buffers(traced).lower(
            self._param_leaves, self.caches, variant.packed, outputs, carried
        )
        return lowered, time.perf_counter() - start

    def _finish_compile(
        self, key: VariantKey, variant: Variant, lowered: Any, lowering_seconds: float
    ) -> Any:
        """Compile a lowered variant and store it (thread-safe: `warmup` runs several at
        once)."""
        start = time.perf_counter()
        compiled = lowered.compile()
        self.compile_seconds[key] = lowering_seconds + time.perf_counter() - start
        self._compiled[key] = compiled
        self.executables.save(variant.description, compiled)
        return compiled

    def _packed_tree(self, batch: StepBatch, key: VariantKey) -> tuple:
        """What the step of `key` reads of `batch`: (inputs, sampling, (token sources, chained
        rows), what follows each prefill chunk), the last None where the variant does not read
        it (a step without drafts feeds no head), chained rows None where no row can move (no
        head drafts)."""
        chains = self.drafter.num_drafts > 0
        sources = (batch.token_sources, batch.chained if chains else None)
        following = batch.following if key.drafts else None
        return batch.inputs, batch.sampling, sources, following
