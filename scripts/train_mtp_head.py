"""Train a multi-token-prediction head for the trained `stdlib` preset, the target frozen.

    python scripts/train_mtp_head.py                     # minutes on 2 busy CPU cores
    python scripts/train_mtp_head.py --steps 20 --warmup-steps 5 --out /tmp/p  # smoke

Run it after `train_preset.py` (which writes the target alone). It loads the preset from `--preset`,
adds NemotronH's MTP head (`num_nextn_predict_layers: 1`, `mtp_hybrid_override_pattern: "*-"`:
an attention block, then an MLP block; `jmamba.mtp.MTPHead`) and trains only the head, on the
same corpus, windows and training ops as the target: at position p the head reads the target's
final-normed hidden state h_p and the token x_(p+1), and the loss is the cross-entropy of its
logits against x_(p+2). The target's forward runs once per batch, outside the gradient. The
training ops are checked against the library references (loss and the head's gradients) before
training, and the final head is evaluated with the references alone.

`--out` gets the preset's files with the head added: config.json gains the two fields,
model.safetensors the `mtp.*` tensors (the target's tensors are copied from the preset's file
byte for byte, and checked), and training.json an "mtp_head" section (the run, held-out loss and
top-1 accuracy of the head's x_(p+2), and the acceptance rates `measure_mtp.py` measures with the
engine on held-out text).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import flax
import jax
import numpy as np
import optax
from flax import nnx
from measure_mtp import measure_acceptance
from safetensors.numpy import load_file, save_file
from stdlib_corpus import load_corpus
from train_preset import (
    BLOCK_SIZE,
    compare_training_ops,
    line_starts,
    optimizer,
    row_inputs,
    windows,
)
from training_ops import fast_training_ops

import jmamba
from jmamba.checkpoints.weights import load_pretrained, save_pretrained

REPO = Path(__file__).resolve().parents[1]
MTP_FIELDS = {"num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*-"}


@dataclasses.dataclass(frozen=True)
class HeadConfig:
    """Knobs of one head-training run (each is a command-line flag of the same name)."""

    seed: int = 0
    steps: int = 3000
    batch_size: int = 16
    seq_len: int = 256
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.1
    log_every: int = 50
    eval_every: int = 250
    eval_windows: int = 32
    measure_prompts: int = 16
    measure_prompt_len: int = 96
    measure_tokens: int = 96
    preset: str = "jmamba/presets/stdlib"
    out: str = "jmamba/presets/stdlib"

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps={self.warmup_steps} must be in [0, steps={self.steps})")


# ---------------------------------------------------------------- the forward and the loss


def fresh_caches(model: nnx.Module, num_tokens: int) -> tuple:
    return model.init_caches(
        num_blocks=num_tokens // BLOCK_SIZE + 1, block_size=BLOCK_SIZE, num_slots=2
    )


def target_hidden(graphdef, head, rest, tokens: jax.Array) -> jax.Array:
    """The target's final-normed hidden states [L, hidden] of one sequence [L + 2] (its first L
    tokens), as the engine hands them to the head."""
    model = nnx.merge(graphdef, head, rest)
    num_tokens = tokens.shape[0] - 2
    inputs = dataclasses.replace(row_inputs(num_tokens), token_ids=tokens[:num_tokens])
    hidden, _ = model.hidden_states(inputs, fresh_caches(model, num_tokens))
    return model.final_norm(hidden)


def head_logits(graphdef, head, rest, hidden: jax.Array, tokens: jax.Array) -> jax.Array:
    """The head's logits [L, vocab] at positions 0..L-1 of one sequence [L + 2], fed h_p and
    x_(p+1); row p predicts x_(p+2)."""
    model = nnx.merge(graphdef, head, rest)
    num_tokens = tokens.shape[0] - 2
    inputs = dataclasses.replace(row_inputs(num_tokens), token_ids=tokens[:num_tokens])
    caches = fresh_caches(model, num_tokens)
    normed, _ = model.mtp_hidden(hidden, tokens[1 : num_tokens + 1], inputs, caches)
    return model.head_logits(normed)


def head_loss(graphdef, head, rest, hidden: jax.Array, batch: jax.Array) -> jax.Array:
    """Mean cross-entropy (nats) of the head's logits against x_(p+2) over a batch [B, L + 2]."""
    logits = jax.vmap(head_logits, (None, None, None, 0, 0))(graphdef, head, rest, hidden, batch)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 2:]).mean()


def batch_hidden(graphdef, head, rest, batch: jax.Array) -> jax.Array:
    return jax.vmap(target_hidden, (None, None, None, 0))(graphdef, head, rest, batch)


@functools.partial(jax.jit, static_argnums=(0, 4))
def loss_and_grads(graphdef, head, rest, batch: jax.Array, fast: bool):
    """The head's loss and its gradients (the target's forward outside the gradient)."""
    with fast_training_ops() if fast else contextlib.nullcontext():
        hidden = batch_hidden(graphdef, head, rest, batch)
        return jax.value_and_grad(head_loss, argnums=1)(graphdef, head, rest, hidden, batch)


@functools.partial(jax.jit, static_argnums=(0, 4))
def eval_batch(graphdef, head, rest, batch: jax.Array, fast: bool):
    """Summed head cross-entropy (nats) and top-1 hits on x_(p+2), and the target's top-1 hits on
    x_(p+1), over a batch [B, L + 2]."""
    with fast_training_ops() if fast else contextlib.nullcontext():
        hidden = batch_hidden(graphdef, head, rest, batch)
        logits = jax.vmap(head_logits, (None, None, None, 0, 0))(
            graphdef, head, rest, hidden, batch
        )
        model = nnx.merge(graphdef, head, rest)
        target_top1 = jax.vmap(model.head_logits)(hidden).argmax(-1)
    labels = batch[:, 2:]
    nats = optax.softmax_cross_entropy_with_integer_labels(logits, labels).sum()
    hits = (logits.argmax(-1) == labels).sum()
    return nats, hits, (target_top1 == batch[:, 1:-1]).sum()


def check_training_ops(graphdef, head, rest, batch: jax.Array) -> dict:
    """The head's loss and gradients with the training ops match the library references."""
    return compare_training_ops(
        *(loss_and_grads(graphdef, head, rest, batch, f) for f in (True, False))
    )


# ---------------------------------------------------------------- model and optimizer


def headed_model(preset: Path, seed: int) -> tuple[nnx.Module, dict]:
    """The preset's trained target with a fresh head (the residual output projections of its
    blocks scaled by 1/sqrt(2 * blocks), as the target's were), and its HF config."""
    hf_config = {**json.loads((preset / "config.json").read_text()), **MTP_FIELDS}
    target = load_pretrained(preset).without_head()  # a head it has already is replaced
    model = jmamba.HybridLM(jmamba.from_hf_config(hf_config), rngs=nnx.Rngs(seed))
    nnx.update(model, nnx.state(target))
    scale = 1.0 / math.sqrt(2 * len(model.mtp.layers))
    for layer in model.mtp.layers:
        for block in (layer.mixer, layer.ffn):
            for proj in ("o_proj", "down_proj"):
                if block is not None and hasattr(block, proj):
                    kernel = getattr(block, proj).kernel
                    kernel.set_value(kernel.get_value() * scale)
    ours = dict(nnx.to_flat_state(nnx.state(model)))
    for path, variable in nnx.to_flat_state(nnx.state(target)):
        np.testing.assert_array_equal(ours[path].get_value(), variable.get_value())
    return model, hf_config


# ---------------------------------------------------------------- training


def evaluate(graphdef, head, rest, heldout: np.ndarray, cfg: HeadConfig, fast: bool) -> dict:
    """Head bits per byte and top-1 accuracy on x_(p+2), and the target's top-1 accuracy on
    x_(p+1), over `eval_windows` evenly spaced held-out windows."""
    length = cfg.seq_len + 2
    starts = np.linspace(0, heldout.size - length, cfg.eval_windows).astype(np.int64)
    batches = np.array_split(starts, max(1, cfg.eval_windows // cfg.batch_size))
    totals = np.zeros(3)
    for b in batches:
        sums = eval_batch(graphdef, head, rest, windows(heldout, b, length), fast)
        totals += [float(x) for x in sums]
    count = cfg.eval_windows * cfg.seq_len
    return dict(
        head_bits_per_byte=totals[0] / count / math.log(2),
        head_top1_accuracy=totals[1] / count,
        target_top1_accuracy=totals[2] / count,
    )


def train(cfg: HeadConfig, model: nnx.Module, corpus) -> tuple[nnx.Module, list[dict], dict]:
    """Train the head; returns the model, the loss curve rows and a summary."""
    graphdef, head, rest = nnx.split(model, nnx.PathContains("mtp"), ...)
    # the target's recipe
    tx = optimizer(cfg.learning_rate, cfg.warmup_steps, cfg.steps, cfg.weight_decay)
    opt_state = tx.init(head)
    rng = np.random.default_rng(cfg.seed)
    starts = line_starts(corpus.train, cfg.seq_len + 2)
    batch_of = lambda: windows(  # noqa: E731
        corpus.train, rng.choice(starts, cfg.batch_size), cfg.seq_len + 2
    )
    check = check_training_ops(graphdef, head, rest, batch_of()[:2])
    print(f"training ops match the references: {check}", flush=True)
    before = evaluate(graphdef, head, rest, corpus.heldout, cfg, fast=True)
    print(f"untrained head: {before}", flush=True)

    @jax.jit
    def step(head, opt_state, batch):
        with fast_training_ops():
            hidden = batch_hidden(graphdef, head, rest, batch)
            loss, grads = jax.value_and_grad(head_loss, argnums=1)(
                graphdef, head, rest, hidden, batch
            )
        updates, opt_state = tx.update(grads, opt_state, head)
        return optax.apply_updates(head, updates), opt_state, loss

    curve, recent, start = [], [], time.time()
    for i in range(1, cfg.steps + 1):
        head, opt_state, loss = step(head, opt_state, batch_of())
        recent.append(float(loss) / math.log(2))
        if i % cfg.log_every == 0 or i == cfg.steps:
            row = dict(step=i, train_head_bits_per_byte=float(np.mean(recent)))
            if i % cfg.eval_every == 0 or i == cfg.steps:
                row |= evaluate(graphdef, head, rest, corpus.heldout, cfg, fast=True)
            row["wall_seconds"] = time.time() - start
            curve.append(row)
            recent = []
            print(json.dumps({k: round(v, 4) for k, v in row.items()}), flush=True)
    train_seconds = time.time() - start
    reference = evaluate(graphdef, head, rest, corpus.heldout, cfg, fast=False)
    summary = dict(
        training_ops_check=check,
        train_seconds=train_seconds,
        tokens_seen=cfg.steps * cfg.batch_size * cfg.seq_len,
        first_train_head_bits_per_byte=curve[0]["train_head_bits_per_byte"],
        final_train_head_bits_per_byte=curve[-1]["train_head_bits_per_byte"],
        untrained_heldout=before,
        heldout=reference,  # with the library references
    )
    return nnx.merge(graphdef, head, rest), curve, summary


# ---------------------------------------------------------------- outputs


def write_headed_preset(model: nnx.Module, hf_config: dict, preset: Path, out: Path) -> dict:
    """`out`: the preset's files, config.json with the MTP fields, model.safetensors with the
    head's `mtp.*` tensors added to the preset's own, which are copied (and checked) bit for bit.
    Returns what the check found."""
    original = {  # the target's tensors (a head the preset has already is replaced)
        name: t
        for name, t in load_file(preset / "model.safetensors").items()
        if not name.startswith("mtp.")
    }
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(model, tmp, hf_config)  # the library's writer names the head's tensors
        written = load_file(Path(tmp) / "model.safetensors")
    head = {name: t for name, t in written.items() if name.startswith("mtp.")}
    if set(written) - set(head) != set(original):
        raise AssertionError("the headed model writes other target tensors than the preset has")
    out.mkdir(parents=True, exist_ok=True)
    if out.resolve() != preset.resolve():
        for name in ("tokenizer.json", "generation_config.json", "training.json"):
            shutil.copy(preset / name, out / name)
    save_file({**original, **head}, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    reread = load_file(out / "model.safetensors")
    for name, tensor in original.items():
        same = reread[name].dtype == tensor.dtype and reread[name].shape == tensor.shape
        if not (same and reread[name].tobytes() == tensor.tobytes()):
            raise AssertionError(f"target tensor {name} changed")
    loaded = dict(nnx.to_flat_state(nnx.state(load_pretrained(out))))
    for path, variable in nnx.to_flat_state(nnx.state(model)):
        np.testing.assert_array_equal(loaded[path].get_value(), variable.get_value())
    return dict(
        target_tensors_byte_identical=len(original),
        head_tensors=sorted(head),
        head_parameters=int(sum(t.size for t in head.values())),
    )


def parse_args(argv: list[str] | None) -> HeadConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for field in dataclasses.fields(HeadConfig):
        parser.add_argument(
            f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default
        )
    return HeadConfig(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    started = time.time()
    preset, out = REPO / cfg.preset, REPO / cfg.out
    record = json.loads((preset / "training.json").read_text())
    corpus = load_corpus()
    if corpus.sha256 != record["corpus"]["sha256"]:
        print("warning: this corpus is not the one the target trained on", flush=True)
    model, hf_config = headed_model(preset, cfg.seed)
    model, curve, summary = train(cfg, model, corpus)
    written = write_headed_preset(model, hf_config, preset, out)
    acceptance = measure_acceptance(
        out,
        corpus.heldout,
        num_prompts=cfg.measure_prompts,
        prompt_len=cfg.measure_prompt_len,
        max_tokens=cfg.measure_tokens,
    )
    section = dict(
        python=platform.python_version(),
        versions={m.__name__: m.__version__ for m in (jax, flax, optax, np)},
        command=" ".join(["python", *sys.argv]),
        corpus_sha256=corpus.sha256,
        mtp_fields=MTP_FIELDS,
        train_config=dataclasses.asdict(cfg),
        results=summary,
        checkpoint=written,
        curve=[{k: round(v, 5) for k, v in r.items()} for r in curve if "head_top1_accuracy" in r],
        acceptance=acceptance,
        total_wall_seconds=time.time() - started,
    )
    record["mtp_head"] = section
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: section[k] for k in ("results", "acceptance")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
