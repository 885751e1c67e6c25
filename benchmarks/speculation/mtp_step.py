"""What the MTP head costs a decode step: the bench model's step without a head, and with a head
in a step that drafts nothing (the plain step, `NoDeviceDrafts`: the head's weights and KV pool
are the program's inputs, unread) or that drafts (`MTPDrafts`: the head, its logits and chain),
device time per step at B = 16 and 64.

B requests of the bench model (`spec_decode --size 1b`) are prefilled by an engine; its
next plain decode step (one lane per row) is replayed `--steps` times, pipelined, with inputs
already on the device; each figure comes with the host's time to dispatch the steps, which is
the figure when the device step is shorter. The three are timed in turn, `--rounds` times.

    python -m benchmarks.speculation mtp_step --size 1b --batches 16,64
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.harness.models import build_model
from benchmarks.speculation.serving import engine_config, workload
from runtime.core.sampling_params import SamplingParams
from runtime.core.speculative_config import SpeculativeConfig
from runtime.engine import Engine


def decode_step(model, config, batch: int):
    """An engine of `batch` requests stepped until its last step was a plain decode step: (its
    runner, bucket, batches)."""
    engine = Engine(model, config)
    for i, prompt in enumerate(workload(model.config.vocab_size, batch, 64, 2)):
        engine.add_request(prompt, SamplingParams(max_tokens=64, ignore_eos=True), request_id=i)
    while engine.last_bucket is None or not engine.last_bucket.is_decode_only:
        engine.step()
    return engine.runner, engine.last_bucket, engine.last_batches


def ms_per_step(runner, bucket, batches, steps: int, drafts: bool) -> tuple[float, float]:
    """(ms per step, ms the host took to dispatch them): when the two are close the replay
    measured the host's dispatch, not the device."""
    packed = runner.device_inputs(bucket, batches)
    for _ in range(3):  # compile and warm the variant
        np.asarray(runner.dispatch(bucket, batches, packed, drafts=drafts).tokens)
    start = time.perf_counter()
    for _ in range(steps):
        step = runner.dispatch(bucket, batches, packed, drafts=drafts)
    dispatched = time.perf_counter()
    np.asarray(step.tokens)
    return 1e3 * (time.perf_counter() - start) / steps, 1e3 * (dispatched - start) / steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1b")
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    batches = tuple(int(b) for b in args.batches.split(","))
    plain, headed = build_model(args.size), build_model(args.size, mtp=True)
    sizes = (max(batches), batches, 1024, 4096)
    spec = SpeculativeConfig("mtp", 1, max_batch_size=1)  # B > 1: plain steps, one lane a row
    print("B  round  no head ms (host)  head, no drafts ms (host)  head, drafts ms (host)")
    for batch in batches:
        none = decode_step(plain, engine_config(*sizes, None), batch)
        mtp = decode_step(headed, engine_config(*sizes, spec), batch)
        for r in range(args.rounds):  # the three alternate, so drift shows as spread
            row = (
                ms_per_step(*none, args.steps, drafts=False),
                ms_per_step(*mtp, args.steps, drafts=False),
                ms_per_step(*mtp, args.steps, drafts=True),
            )
            cells = "  ".join(f"{ms:8.3f} ({host:.3f})" for ms, host in row)
            print(f"{batch:3d} {r:5d}  {cells}", flush=True)
