"""What each sampler mode costs on the device: the step's sampler (`runtime.device.sampler.sample`)
alone, for a greedy batch, in the greedy mode and in the modes it would run in if the modes were
merged into one program (sampled: the Gumbel draw over the vocabulary; filtered: the sort for
top-k / top-p; with log-probabilities), at decode batch sizes and a real vocabulary.

    python -m benchmarks.engine sampler_modes --vocab 151936 --batches 1,16,64,256

Issue 54 asks for sampling modes that differ only in data to be one program unless a measured
cost says otherwise: this is that measurement. Each row gives microseconds per call (timed inside
one jitted loop, `benchmarks.harness.timing.time_loop`) and the extra over the greedy mode; the
tokens of every mode are checked equal to the greedy mode's for the greedy batch.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness.timing import log, record, time_loop
from runtime.core.sampling_inputs import SamplingInputs, SamplingMode
from runtime.device.sampler import logprobs, sample

MODES = {
    "greedy": SamplingMode(),
    "sampled": SamplingMode(sampled=True),
    "filtered": SamplingMode(sampled=True, filtered=True),
    "greedy+logprobs": SamplingMode(logprobs=True, top_logprobs=8),
    "sampled+logprobs": SamplingMode(sampled=True, logprobs=True, top_logprobs=8),
}


def greedy_inputs(batch: int) -> SamplingInputs:
    """A batch of greedy rows (temperature 0), as the builder fills it."""
    zeros = np.zeros(batch, np.int32)
    return SamplingInputs(
        temperature=np.zeros(batch, np.float32),
        top_k=zeros,
        top_p=np.ones(batch, np.float32),
        seeds=np.arange(batch, dtype=np.int32),
        counters=zeros,
        masked_ids=np.zeros((batch, 0), np.int32),
        num_masked=zeros,
        penalties=None,
    )


def sampler_call(mode: SamplingMode):
    """`time_loop`'s step: the sampler on logits shifted by the call's index and with the call's
    sample counters (so XLA cannot merge calls, nor hoist the random draw out of the loop),
    log-probabilities too where the mode asks. The sampling inputs are arguments of the loop, as
    they are of the step: closed over, they are constants, and XLA drops the draw of rows it
    sees are greedy (a first version of this bench timed every mode alike that way)."""

    def step(i, state, inputs):
        logits, params = inputs
        call = params._replace(counters=params.counters + i)
        tokens = sample(logits + (state + i), call, mode)
        if mode.logprobs:
            # Summed over every row into the output, so no row's log-probabilities are dropped.
            computed = logprobs(logits, tokens, mode.top_logprobs)
            tokens = tokens + (computed.top_ids.sum() + computed.sampled.sum() > 1e30)
        return tokens, state

    return step


def bench(vocab: int, batch: int, inner: int) -> None:
    logits = jax.random.normal(jax.random.key(batch), (batch, vocab), jnp.float32)
    params = jax.tree.map(jnp.asarray, greedy_inputs(batch))
    want = np.asarray(jnp.argmax(logits, axis=-1))
    base = None
    for name, mode in MODES.items():
        tokens = np.asarray(jax.jit(lambda x, m=mode: sample(x, params, m))(logits))
        step = sampler_call(mode)
        us = time_loop(step, jnp.zeros((), jnp.float32), inner, inputs=(logits, params))
        base = us if base is None else base
        record(
            bench="sampler_modes",
            vocab=vocab,
            batch=batch,
            mode=name,
            us=round(us, 2),
            extra_us=round(us - base, 2),
            tokens_equal=bool((tokens == want).all()),
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--inner", type=int, default=20, help="sampler calls per timed loop")
    args = parser.parse_args(argv)
    log(f"sampler modes on {jax.devices()[0].device_kind}, vocab {args.vocab}")
    for batch in map(int, args.batches.split(",")):
        bench(args.vocab, batch, args.inner)
