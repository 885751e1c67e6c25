"""Where does a bf16 request round differently beside other requests? Layer by layer.

The bench model (random bf16 weights) prefills `--prompts` prompts in one engine step, and
prompt `--row` alone in another engine (`--batch-invariant`: both with the fixed-tile products);
with `--step decode`, their next (decode) steps instead, on the caches their prefill steps
wrote. The steps' `StepInputs` are run again through the model's layers one part at a time (the
mixer's norm, the mixer, the FFN's norm, the FFN, the residual sums; then the step's logits
rows, their final norm and logits), and for the prompt's own
token lanes each part's output is compared bitwise: the first parts that differ name the
operation whose rounding depends on the batch.

    PYTHONPATH=. python benchmarks/probe_layer_rounding.py --size 1b --prompts 16 --step decode
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.checks.batch_invariance import Setup, engine_config, make_prompts
from benchmarks.engine.models import build_model
from jmamba.layers.invariance import batch_invariant
from jmamba.model import rows_or_zeros
from runtime.core.sampling_params import SamplingParams
from runtime.engine import Engine


def first_steps(model, config, prompts: list[list[int]]):
    """The StepInputs of an engine's first two steps given `prompts` (all prefilled whole in the
    first, decoded in the second), and its resolved config."""
    engine = Engine(model, config)
    for prompt in prompts:
        engine.add_request(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    steps = []
    for _ in range(2):
        engine.step()
        steps.append(engine.last_batches[0].inputs)
    return steps, engine.config


def parts(model, inputs, caches) -> dict[str, jax.Array]:
    """Each layer's intermediate outputs (what `Layer.__call__` computes), keyed in order."""
    x = model.embed_tokens(inputs.token_ids)
    embeddings, out = x, []
    for i, (layer, cache) in enumerate(zip(model.layers, caches, strict=False)):
        name = f"{i}:{type(layer.mixer).__name__ if layer.mixer is not None else '-'}"
        if layer.mixer is not None:
            if layer.reads_embeddings:
                y, _ = layer.mixer(x, embeddings, cache, inputs)
            else:
                normed = layer.mixer_norm(x)
                out.append((f"{name} norm", normed))
                y, _ = layer.mixer(normed, cache, inputs)
            out.append((f"{name} mixer", y))
            x = x + y * layer.residual_multiplier
        if layer.ffn is not None:
            normed = layer.ffn_norm(x)
            f = layer.ffn(normed)
            out += [(f"{name} ffn_norm", normed), (f"{name} ffn", f)]
            x = x + f * layer.residual_multiplier
        out.append((f"{name} out", x))
    rows = rows_or_zeros(x, inputs.logits_indices)  # the step's logits rows, as `_rank_step`
    normed = model.final_norm(rows)
    out += [("logits rows", rows), ("final_norm", normed), ("logits", model.head_logits(normed))]
    return {f"{k:04d} {name}": value for k, (name, value) in enumerate(out)}


def lanes_of_row(inputs, row: int, decode: bool) -> np.ndarray:
    """Token lanes of prefill row `row`, or of decode row `row`."""
    width = inputs.decode.width
    if decode:
        return np.arange(row * width, row * width + int(inputs.decode.query_lens[row]))
    qsl = np.asarray(inputs.prefill.query_start_loc)
    start = inputs.decode.num_rows * width
    return np.arange(start + qsl[row], start + qsl[row + 1])


def logits_row(inputs, row: int, decode: bool) -> np.ndarray:
    """The logits row of decode row `row` (its first lane's) or of prefill row `row`."""
    width = inputs.decode.width
    return np.array([row * width if decode else inputs.decode.num_rows * width + row])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="1b")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--row", type=int, default=4, help="the prompt compared (4: 2 chunks + 2)")
    parser.add_argument("--step", choices=["prefill", "decode"], default="prefill")
    parser.add_argument("--show", type=int, default=12, help="differing parts to print")
    args = parser.parse_args(argv)
    model = build_model(args.size)
    setup = Setup(args.prompts, 2, batch_invariant=args.batch_invariant)
    prompts = make_prompts(args.prompts, model.config.chunk_size, model.config.vocab_size, 0)
    config = engine_config(prompts, setup)
    together, resolved = first_steps(model, config, prompts)
    alone, _ = first_steps(model, config, [prompts[args.row]])
    graphdef, state = nnx.split(model)
    decode = args.step == "decode"

    @jax.jit
    def run(state, steps):
        model = nnx.merge(graphdef, state)
        caches = model.init_caches(
            num_blocks=resolved.num_blocks,
            block_size=resolved.block_size,
            num_slots=resolved.num_slots,
        )
        with batch_invariant(args.batch_invariant):
            if decode:  # the prefill step's caches first
                _, caches = model.hidden_states(steps[0], caches)
            return parts(model, steps[1] if decode else steps[0], caches)

    a = run(state, jax.tree.map(jnp.asarray, together))
    b = run(state, jax.tree.map(jnp.asarray, alone))
    step = 1 if decode else 0
    lanes_a = lanes_of_row(together[step], args.row, decode)
    lanes_b = lanes_of_row(alone[step], 0, decode)
    device = jax.devices()[0].device_kind
    print(f"device={device} prompt {args.row}, {args.step}: {len(lanes_a)} lanes", flush=True)
    shown = 0
    rows_a = logits_row(together[step], args.row, decode)
    rows_b = logits_row(alone[step], 0, decode)
    for name in sorted(a):
        x, y = a[name], b[name]
        by_row = name.split(" ", 1)[1] in ("logits rows", "final_norm", "logits")
        xa = np.asarray(x[rows_a if by_row else lanes_a].astype(jnp.float32))
        yb = np.asarray(y[rows_b if by_row else lanes_b].astype(jnp.float32))
        differ = int((xa != yb).sum())
        if differ and shown < args.show:
            print(f"{name:28s} {differ:8d} of {xa.size} differ, max {np.abs(xa - yb).max():.2e}")
            shown += 1
    print(f"{len(a)} parts compared; {shown} shown", flush=True)


if __name__ == "__main__":
    main()
