"""What `EngineConfig.batch_invariant` costs a decode step: the bench model's plain decode step
with XLA's GEMMs and with the fixed-tile matmul, device time per step at each B, in one process
(off, on, off again: the host's drift shows as the two off columns' gap).

B requests of the bench model (`bench_spec_decode.py --size 1b`) are prefilled by an engine; its
next plain decode step is replayed `--steps` times, pipelined, with inputs already on the device
(`probe_mtp_step.py`'s method), so the host's time is not in the figure.

    PYTHONPATH=. python benchmarks/probe_batch_invariant_step.py --batches 1,16,64
"""

from __future__ import annotations

import argparse
import dataclasses

from benchmarks.engine.models import build_model
from benchmarks.probe_mtp_step import decode_step, ms_per_step
from benchmarks.speculation.serving import engine_config


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="1b")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    batches = tuple(int(b) for b in args.batches.split(","))
    model = build_model(args.size)
    config = engine_config(max(batches), batches, 1024, 4096, None)
    invariant = dataclasses.replace(config, batch_invariant=True)
    rows = []
    print("B  XLA ms  fixed tiles ms  XLA again ms  fixed / XLA")
    for batch in batches:
        xla, fixed = decode_step(model, config, batch), decode_step(model, invariant, batch)
        off = ms_per_step(*xla, args.steps, drafts=False)
        on = ms_per_step(*fixed, args.steps, drafts=False)
        again = ms_per_step(*xla, args.steps, drafts=False)
        rows.append(dict(batch=batch, xla_ms=off, fixed_ms=on, xla_again_ms=again))
        ratio = on / ((off + again) / 2)
        print(f"{batch:3d} {off:7.3f} {on:15.3f} {again:13.3f} {ratio:12.2f}x", flush=True)
    return rows


if __name__ == "__main__":
    main()
