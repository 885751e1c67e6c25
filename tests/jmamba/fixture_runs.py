"""Run a transformers fixture (tests/fixtures/<name>) through our model the way HF ran it.

Shared by the CPU parity test (tests/jmamba/test_parity.py) and the GPU check
(benchmarks/checks/fixtures.py). Each run returns `Comparison`s, our array beside HF's, so the
test asserts them and the GPU check reports their max |delta|. The chunk schedule of each sequence
is data in expected.npz (`chunks_a`, `chunks_b`: the (start, stop) prefill calls; after the last
one the sequence is decoded one token per step), so other lengths and schedules need no code.

Both sequences share every step, at non-trivial state slots and scattered KV blocks, with padding
rows and tokens in every step, garbage in every pool entry a request does not own, and NaN in the
NULL slot and block.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx

from jmamba.checkpoints.weights import load_pretrained
from jmamba.config import Mixer
from jmamba.mixers.parallel_hybrid import ParallelHybridCache
from jmamba.model import HybridLM
from tests.jmamba.steps import Row, build

FIXTURES = Path(__file__).parents[1] / "fixtures"
ORIGINAL = ("mamba2", "nemotron_h", "qwen3_next", "qwen3_5", "qwen3_5_moe")
ODD = tuple(f"{name}_odd" for name in ORIGINAL)  # non-power-of-two dims, several kernel chunks
FALCON_H1 = ("falcon_h1", "falcon_h1_odd")  # attention beside Mamba2 in every layer, muP weights
IBM = ("bamba", "bamba_odd", "granite_h", "granite_h_odd")  # Mamba2 + attention; Granite with MoE
# Qwen3.5 as published: the multimodal wrappers (vision tower skipped), odd dims, text-only input.
VL = ("qwen3_5_vl", "qwen3_5_moe_vl")
# Zamba2: Mamba2 layers and hybrid ones (2 shared transformer blocks, each used at 2+ layers, LoRA
# adapters on q, k, v and gate | up at every use site).
ZAMBA2 = ("zamba2", "zamba2_odd")
ALL = ORIGINAL + ODD + FALCON_H1 + IBM + VL + ZAMBA2
BLOCK, NUM_SLOTS = 16, 8
SLOT_A, SLOT_B = 3, 6
SPARE_BLOCKS = 3  # never owned by a request: they only hold garbage
PAD_ROWS, PAD_TOKENS = 1, 3  # padding rows / tokens added to every step

Step = Callable[[Any, Any, Any], tuple[jax.Array, Any]]


class Comparison(NamedTuple):
    """Our array and HF's for one quantity (`name`, e.g. 'logits_full_a' or 'rec_b_3')."""

    name: str
    ours: np.ndarray
    theirs: np.ndarray

    @property
    def max_error(self) -> float:
        """max |ours - theirs|; inf if any entry is NaN (a NaN must never look small)."""
        delta = np.abs(self.ours - self.theirs)
        return float("inf") if np.isnan(delta).any() else float(delta.max())


@dataclasses.dataclass
class Fixture:
    """A loaded fixture: the model, its parameters, a jitted step and HF's arrays."""

    name: str
    model: HybridLM
    params: Any
    step: Step
    expected: dict[str, np.ndarray]

    @property
    def seqs(self) -> tuple[np.ndarray, np.ndarray]:
        return self.expected["seq_a"], self.expected["seq_b"]

    @property
    def max_blocks(self) -> int:
        return math.ceil(max(len(s) for s in self.seqs) / BLOCK)

    @property
    def num_blocks(self) -> int:
        return 1 + sum(math.ceil(len(s) / BLOCK) for s in self.seqs) + SPARE_BLOCKS

    def blocks(self) -> tuple[list[int], list[int]]:
        """Scattered KV blocks of a and b (a fixed shuffle of 1..num_blocks-1; 0 is NULL)."""
        order = np.random.default_rng(0).permutation(np.arange(1, self.num_blocks)).tolist()
        n_a = math.ceil(len(self.seqs[0]) / BLOCK)
        return order[:n_a], order[n_a : n_a + math.ceil(len(self.seqs[1]) / BLOCK)]


def load(name: str, wrap: Callable[[Step], Step] = lambda step: step) -> Fixture:
    """Load fixture `name` with our loader and jit its step; `wrap` may wrap the jitted step (to
    pick the kernel implementation while it is traced)."""
    model = load_pretrained(FIXTURES / name)
    graphdef, params = nnx.split(model)
    jitted = jax.jit(lambda p, c, i: nnx.merge(graphdef, p)(i, c), donate_argnums=1)
    expected = dict(np.load(FIXTURES / name / "expected.npz"))
    return Fixture(name, model, params, wrap(jitted), expected)


def poisoned_caches(fx: Fixture) -> Any:
    """Pools full of garbage (they are never zeroed on allocation) and NaN in slot 0 / block 0."""
    caches = fx.model.init_caches(num_blocks=fx.num_blocks, block_size=BLOCK, num_slots=NUM_SLOTS)
    rng = np.random.default_rng(0)

    def poison(leaf):
        garbage = rng.standard_normal(leaf.shape).astype(leaf.dtype)
        garbage[0] = np.nan
        return jax.numpy.asarray(garbage)

    return jax.tree.map(poison, caches)


def run_full(fx: Fixture) -> tuple[list[Comparison], np.ndarray]:
    """One prefill step over both whole sequences plus padding; returns the logits comparisons
    and the logits of the padding tokens (they must be finite)."""
    (a, b), (blocks_a, blocks_b) = fx.seqs, fx.blocks()
    rows = [Row(list(a), 0, SLOT_A, SLOT_A, blocks_a), Row(list(b), 0, SLOT_B, SLOT_B, blocks_b)]
    inputs = build(
        [],
        rows,
        block_size=BLOCK,
        max_blocks=fx.max_blocks,
        pad_prefill_rows=PAD_ROWS,
        pad_tokens=5,
        all_logits=True,
    )
    logits, _ = fx.step(fx.params, poisoned_caches(fx), inputs)
    logits = np.asarray(logits)
    n_a, n_b = len(a), len(b)
    return [
        Comparison("logits_full_a", logits[:n_a], fx.expected["logits_full_a"]),
        Comparison("logits_full_b", logits[n_a : n_a + n_b], fx.expected["logits_full_b"]),
    ], logits[n_a + n_b :]


def calls(chunks: np.ndarray, length: int) -> list[tuple[int, int, bool]]:
    """(start, stop, is_decode) per step of one sequence: its prefill chunks, then decodes."""
    prefills = [(int(s), int(e), False) for s, e in chunks]
    return prefills + [(t, t + 1, True) for t in range(prefills[-1][1], length)]


def logit_positions(chunks: np.ndarray, length: int) -> list[int]:
    """Positions whose logits the chunked schedule produces: each call's last token."""
    return [stop - 1 for _, stop, _ in calls(chunks, length)]


def step_calls(fx: Fixture) -> list[list[tuple[int, tuple[int, int, bool]]]]:
    """Per step, (sequence index, its call) for each sequence that still has a call."""
    schedules = [calls(fx.expected[f"chunks_{t}"], len(fx.seqs[i])) for i, t in enumerate("ab")]
    num_steps = max(len(sched) for sched in schedules)
    return [[(i, s[k]) for i, s in enumerate(schedules) if k < len(s)] for k in range(num_steps)]


def run_chunked(fx: Fixture) -> tuple[list[Comparison], Any]:
    """Both sequences through their chunk schedules, one call of each per step, in one set of
    pools; returns the logits comparisons and the final caches.

    Every step has 2 + 1 decode rows; steps with a prefill chunk have 2 + 1 prefill rows padded to
    one token count (so they compile once), decode steps one padding prefill row.
    """
    steps = step_calls(fx)
    most_tokens = max(sum(e - s for _, (s, e, dec) in now if not dec) for now in steps)
    slots, blocks = (SLOT_A, SLOT_B), fx.blocks()
    caches = poisoned_caches(fx)
    logits: tuple[list, list] = ([], [])
    for calls_now in steps:
        rows = {
            i: Row(list(fx.seqs[i][s:e]), s, slots[i], slots[i], blocks[i])
            for i, (s, e, _) in calls_now
        }
        decode = [i for i, (_, _, dec) in calls_now if dec]
        prefill = [i for i, (_, _, dec) in calls_now if not dec]
        tokens = sum(len(rows[i].tokens) for i in prefill)
        inputs = build(
            [rows[i] for i in decode],
            [rows[i] for i in prefill],
            block_size=BLOCK,
            max_blocks=fx.max_blocks,
            pad_decode_rows=2 + PAD_ROWS - len(decode),
            pad_prefill_rows=2 + PAD_ROWS - len(prefill) if prefill else PAD_ROWS,
            pad_tokens=most_tokens - tokens + PAD_TOKENS if prefill else PAD_TOKENS,
        )
        out, caches = fx.step(fx.params, caches, inputs)
        out = np.asarray(out)  # decode rows (2 + PAD_ROWS), then each prefill row's last token
        for j, i in enumerate(decode + prefill):
            logits[i].append(out[j if j < len(decode) else 2 + PAD_ROWS + j - len(decode)])
    comparisons = []
    for i, (t, seq) in enumerate(zip("ab", fx.seqs, strict=True)):
        positions = logit_positions(fx.expected[f"chunks_{t}"], len(seq))
        theirs = fx.expected[f"logits_chunked_{t}"][positions]
        comparisons.append(Comparison(f"logits_chunked_{t}", np.stack(logits[i]), theirs))
    return comparisons, caches


def recurrent_layers(fx: Fixture) -> list[int]:
    """Our indices of the layers with a recurrent state (HF's `recurrent_layers` must be the
    same): Mamba2, GDN, parallel hybrid and transformer + Mamba2 ones."""
    return [i for i, m in enumerate(fx.model.config.mixers) if m.uses_state]


def recurrent_state(cache: Any) -> Any:
    """A recurrent layer's state: its cache, or the Mamba2 half of a layer that also keeps KV
    blocks (parallel hybrid, transformer + Mamba2)."""
    return cache.state if isinstance(cache, ParallelHybridCache) else cache


def final_states(fx: Fixture, caches: Any) -> list[Comparison]:
    """Conv and recurrent states of a and b after the chunked run, ours beside HF's."""
    out = []
    for i in recurrent_layers(fx):
        conv, rec = (np.asarray(x) for x in jax.tree.leaves(recurrent_state(caches[i])))
        if fx.model.config.mixers[i] == Mixer.GDN:
            rec = rec.transpose(0, 1, 3, 2)  # ours [V, K] per head, HF [K, V]
        for slot, t in ((SLOT_A, "a"), (SLOT_B, "b")):
            # HF keeps the whole kernel window; we keep its last d_conv - 1 inputs.
            out.append(Comparison(f"conv_{t}_{i}", conv[slot], fx.expected[f"conv_{t}_{i}"][:, 1:]))
            out.append(Comparison(f"rec_{t}_{i}", rec[slot], fx.expected[f"rec_{t}_{i}"]))
    return out


def null_slot_untouched(fx: Fixture, caches: Any) -> bool:
    """Slot 0 of every recurrent pool still holds its NaN poison (it is never written)."""
    return all(
        bool(np.isnan(np.asarray(leaf)[0]).all())
        for i in recurrent_layers(fx)
        for leaf in jax.tree.leaves(recurrent_state(caches[i]))
    )
