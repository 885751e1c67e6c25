"""Train the built-in `stdlib` preset: a tiny NemotronH-style hybrid on the Python standard library.

    pip install -e '.[train]'
    python scripts/train_preset.py                       # about 20 minutes on 2 busy CPU cores
    python scripts/train_preset.py --steps 20 --warmup-steps 5 --out /tmp/p --docs /tmp/p  # smoke

Writes the checkpoint directory `--out` (config.json, model.safetensors, tokenizer.json,
generation_config.json, training.json) and the loss curve (`--docs`: stdlib_loss.csv and .png).
It trains the library's own `HybridLM`, so the weights load into it by construction: a batch is a
`vmap` over single prefill rows, each one sequence from position 0 in fresh caches with logits at
every token. The library's CPU references for the SSD scan, the causal conv and paged attention
are differentiable but slow to train through, so the training step swaps in the one-row closed
forms of `training_ops.py`; this script checks them against the references (loss and gradients)
before training and evaluates the final model with the references alone.

Seeded, fixed number of steps; `training.json` records the Python version and the corpus hash
(`stdlib_corpus.py`) so a re-run can tell whether it trained on the same text.

The checkpoint written here is the target alone: `train_mtp_head.py` then trains the preset's MTP
head with this model frozen and adds it to the same directory (run it after a retraining).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import functools
import json
import math
import platform
import sys
import time
from pathlib import Path

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from stdlib_corpus import Corpus, load_corpus
from training_ops import fast_training_ops

import jmamba
from jmamba.checkpoints.weights import save_pretrained
from jmamba.mixers.mamba2 import Mamba2, a_from_log
from jmamba.step.invariants import check_step_inputs
from jmamba.step.pytree import DecodeRows, PrefillRows, StepInputs
from jmamba.text.tokenizer import EOS_ID, VOCAB_SIZE, byte_tokenizer

REPO = Path(__file__).resolve().parents[1]
BLOCK_SIZE = 16
SAMPLE_PROMPTS = ("def ", "import ", "class ")

MODEL_CONFIG = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "vocab_size": VOCAB_SIZE,
    "eos_token_id": EOS_ID,
    "hidden_size": 128,
    "layers_block_type": ["mamba", "mlp", "attention", "mlp", "mamba", "mlp"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 384,
    "mlp_hidden_act": "relu2",
    "mamba_num_heads": 8,
    "mamba_head_dim": 32,
    "expand": 2,
    "ssm_state_size": 32,
    "n_groups": 1,
    "conv_kernel": 4,
    "chunk_size": 64,
    "use_conv_bias": True,
    "time_step_min": 0.001,
    "time_step_max": 0.1,
    "layer_norm_epsilon": 1e-5,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "dtype": "float32",
}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Knobs of one training run (each is a command-line flag of the same name)."""

    seed: int = 0
    steps: int = 2000
    batch_size: int = 16
    seq_len: int = 256
    learning_rate: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.1
    log_every: int = 10
    eval_every: int = 100
    eval_windows: int = 32
    sample_tokens: int = 160
    out: str = "jmamba/presets/stdlib"
    docs: str = "docs/presets"

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps={self.warmup_steps} must be in [0, steps={self.steps})")


# ---------------------------------------------------------------- the forward and the loss


def row_inputs(num_tokens: int) -> StepInputs:
    """One prefill row of `num_tokens` from position 0: KV blocks 1.., state slot 1, logits at
    every token. Token ids are zeros here; the loss puts the sequence in."""
    i32 = functools.partial(np.asarray, dtype=np.int32)
    width = num_tokens // BLOCK_SIZE
    empty = np.zeros(0, np.int32)
    decode = DecodeRows(
        empty, empty, empty, np.zeros((0, 1), np.int32), np.zeros((0, width), np.int32)
    )
    prefill = PrefillRows(
        query_start_loc=i32([0, num_tokens]),
        num_computed=i32([0]),
        seq_lens=i32([num_tokens]),
        has_initial_state=np.array([False]),
        read_slots=i32([0]),
        write_slots=i32([1]),
        block_table=i32(1 + np.arange(width))[None],
    )
    arange = np.arange(num_tokens, dtype=np.int32)
    last_logit = i32([num_tokens - 1])
    serving = StepInputs(
        np.zeros(num_tokens, np.int32), arange, BLOCK_SIZE + arange, decode, prefill, last_logit
    )
    # A serving step asks for the last token's logits only; check that layout, then ask for all.
    check_step_inputs(serving, block_size=BLOCK_SIZE, num_blocks=width + 1, num_slots=2)
    return dataclasses.replace(serving, logits_indices=arange)


def sequence_loss(graphdef, params, tokens: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy (nats) of one sequence [L + 1]."""
    model = nnx.merge(graphdef, params)
    num_tokens = tokens.shape[0] - 1
    inputs = dataclasses.replace(row_inputs(num_tokens), token_ids=tokens[:-1])
    caches = model.init_caches(
        num_blocks=num_tokens // BLOCK_SIZE + 1, block_size=BLOCK_SIZE, num_slots=2
    )
    logits, _ = model(inputs, caches)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[1:]).mean()


@functools.partial(jax.jit, static_argnums=(0, 3))
def batch_loss(graphdef, params, batch: jax.Array, fast: bool) -> jax.Array:
    """Mean loss of a batch [B, L + 1]; `fast` traces with the training ops swapped in."""
    with fast_training_ops() if fast else contextlib.nullcontext():
        return jax.vmap(sequence_loss, (None, None, 0))(graphdef, params, batch).mean()


def check_training_ops(graphdef, params, batch: jax.Array) -> dict:
    """Loss and gradients with the training ops match the library references on `batch`."""
    grad = jax.value_and_grad(batch_loss, argnums=1)
    return compare_training_ops(*(grad(graphdef, params, batch, f) for f in (True, False)))


def compare_training_ops(fast: tuple, reference: tuple) -> dict:
    """(loss, grads) with the training ops against (loss, grads) with the library references:
    their relative errors, or AssertionError past 1e-5 (loss) or 1e-3 (worst gradient)."""
    (fast_loss, fast_grads), (ref_loss, ref_grads) = fast, reference
    worst = max(
        float(jnp.abs(a - b).max() / (jnp.abs(b).max() + 1e-12))
        for a, b in zip(jax.tree.leaves(fast_grads), jax.tree.leaves(ref_grads), strict=True)
    )
    loss_error = abs(float(fast_loss) - float(ref_loss)) / float(ref_loss)
    if loss_error > 1e-5 or worst > 1e-3:
        raise AssertionError(
            f"training ops disagree with the references: loss {loss_error:.2e}, grads {worst:.2e}"
        )
    return {"loss_relative_error": loss_error, "worst_gradient_relative_error": worst}


# ---------------------------------------------------------------- model and optimizer


def init_model(seed: int) -> nnx.Module:
    """`HybridLM` with Mamba2's usual SSM initialisation (dt log-uniform in [time_step_min,
    time_step_max], A in [1, 16]) and residual output projections scaled by 1/sqrt(2 * layers)."""
    config = jmamba.from_hf_config(MODEL_CONFIG)
    model = jmamba.HybridLM(config, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    out_scale = 1.0 / math.sqrt(2 * len(model.layers))
    low, high = np.log(MODEL_CONFIG["time_step_min"]), np.log(MODEL_CONFIG["time_step_max"])
    for layer in model.layers:
        block = layer.mixer if layer.mixer is not None else layer.ffn
        for proj in ("out_proj", "o_proj", "down_proj"):
            if hasattr(block, proj):
                kernel = getattr(block, proj).kernel
                kernel.set_value(kernel.get_value() * out_scale)
        if isinstance(block, Mamba2):
            heads = config.mamba2.num_heads
            dt = np.exp(rng.uniform(low, high, heads))
            block.dt_bias.set_value(jnp.asarray(dt + np.log(-np.expm1(-dt)), jnp.float32))
            a_log = np.log(rng.uniform(1, 16, heads)).astype(np.float32)
            block.A.set_value(jnp.asarray(a_from_log(a_log)))  # A itself is trained
    return model


def optimizer(
    learning_rate: float, warmup_steps: int, steps: int, weight_decay: float
) -> optax.GradientTransformation:
    """AdamW, warmup then cosine decay to a tenth, no decay on vectors, gradient norm <= 1."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, learning_rate, warmup_steps, steps, learning_rate / 10
    )
    matrices = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=weight_decay, mask=matrices),
    )


# ---------------------------------------------------------------- training


def line_starts(tokens: np.ndarray, length: int) -> np.ndarray:
    """Offsets where a line (or a file) begins and a window of `length` fits. Training windows
    start there because prompts do: a model that has only seen windows starting mid-line reads
    a prompt "import " as the middle of a sentence in a docstring."""
    after = np.flatnonzero((tokens[:-1] == ord("\n")) | (tokens[:-1] == EOS_ID)) + 1
    starts = np.concatenate([[0], after])
    return starts[starts <= tokens.size - length]


def windows(tokens: np.ndarray, starts: np.ndarray, length: int) -> jax.Array:
    return jnp.asarray(tokens[starts[:, None] + np.arange(length)])


def evaluate(graphdef, params, heldout: np.ndarray, cfg: TrainConfig, fast: bool) -> float:
    """Bits per byte on `eval_windows` evenly spaced held-out windows."""
    starts = np.linspace(0, heldout.size - cfg.seq_len - 1, cfg.eval_windows).astype(np.int64)
    batches = np.array_split(starts, max(1, cfg.eval_windows // cfg.batch_size))
    losses = [
        float(batch_loss(graphdef, params, windows(heldout, b, cfg.seq_len + 1), fast))
        for b in batches
    ]
    return float(np.mean(losses)) / math.log(2)


def train(cfg: TrainConfig, corpus: Corpus) -> tuple[nnx.Module, list[dict], dict]:
    """Run the training loop; returns the model, the loss curve rows and a summary."""
    graphdef, params = nnx.split(init_model(cfg.seed))
    tx = optimizer(cfg.learning_rate, cfg.warmup_steps, cfg.steps, cfg.weight_decay)
    opt_state = tx.init(params)
    rng = np.random.default_rng(cfg.seed)
    starts = line_starts(corpus.train, cfg.seq_len + 1)
    batch_of = lambda: windows(  # noqa: E731
        corpus.train, rng.choice(starts, cfg.batch_size), cfg.seq_len + 1
    )
    check = check_training_ops(graphdef, params, batch_of()[:2])
    print(f"training ops match the references: {check}", flush=True)

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(batch_loss, argnums=1)(graphdef, params, batch, True)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    curve, recent, start = [], [], time.time()
    for i in range(1, cfg.steps + 1):
        params, opt_state, loss = step(params, opt_state, batch_of())
        recent.append(float(loss) / math.log(2))
        if i % cfg.log_every == 0 or i == cfg.steps:
            row = dict(
                step=i,
                tokens=i * cfg.batch_size * cfg.seq_len,
                train_bits_per_byte=float(np.mean(recent)),
            )
            if i % cfg.eval_every == 0 or i == cfg.steps:
                row["eval_bits_per_byte"] = evaluate(
                    graphdef, params, corpus.heldout, cfg, fast=True
                )
            row["wall_seconds"] = time.time() - start
            curve.append(row)
            recent = []
            print(
                json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
                flush=True,
            )
    summary = dict(
        training_ops_check=check,
        train_seconds=time.time() - start,
        tokens_seen=cfg.steps * cfg.batch_size * cfg.seq_len,
        final_train_bits_per_byte=curve[-1]["train_bits_per_byte"],
        heldout_bits_per_byte=curve[-1]["eval_bits_per_byte"],
        heldout_bits_per_byte_reference_ops=evaluate(
            graphdef, params, corpus.heldout, cfg, fast=False
        ),
    )
    return nnx.merge(graphdef, params), curve, summary


# ---------------------------------------------------------------- outputs


def samples(out: Path, max_tokens: int) -> dict[str, str]:
    """Greedy continuations of `SAMPLE_PROMPTS` by the written checkpoint, through `LLM`."""
    from runtime.core.sampling_params import SamplingParams
    from runtime.llm import LLM

    llm = LLM(str(out), max_num_seqs=len(SAMPLE_PROMPTS), max_model_len=256, warmup=False)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    outputs = llm.generate(list(SAMPLE_PROMPTS), params, use_tqdm=False)
    return {p: p + o.text for p, o in zip(SAMPLE_PROMPTS, outputs, strict=True)}


def write_checkpoint(model: nnx.Module, out: Path, record: dict) -> None:
    save_pretrained(model, out, MODEL_CONFIG)
    byte_tokenizer().save(str(out / "tokenizer.json"))
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": EOS_ID}, indent=2) + "\n"
    )
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")


def write_curve(curve: list[dict], docs: Path) -> None:
    """The loss curve as CSV and PNG."""
    import matplotlib

    matplotlib.use("Agg")  # a file, no display
    import matplotlib.pyplot as plt

    docs.mkdir(parents=True, exist_ok=True)
    fields = ["step", "tokens", "train_bits_per_byte", "eval_bits_per_byte", "wall_seconds"]
    with open(docs / "stdlib_loss.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(
            {k: round(v, 5) if isinstance(v, float) else v for k, v in row.items()} for row in curve
        )
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot([r["tokens"] for r in curve], [r["train_bits_per_byte"] for r in curve], label="train")
    evals = [r for r in curve if "eval_bits_per_byte" in r]
    ax.plot(
        [r["tokens"] for r in evals],
        [r["eval_bits_per_byte"] for r in evals],
        "o-",
        label="held-out",
    )
    ax.set(
        xlabel="training tokens (bytes)", ylabel="bits per byte", title="tiny-stdlib training loss"
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(docs / "stdlib_loss.png", dpi=120)


def parse_args(argv: list[str] | None) -> TrainConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for field in dataclasses.fields(TrainConfig):
        parser.add_argument(
            f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default
        )
    return TrainConfig(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    started = time.time()
    corpus = load_corpus()
    files, size = len(corpus.train_files), corpus.train.size
    print(f"corpus: {files} files, {size} bytes, sha256 {corpus.sha256[:16]}", flush=True)
    model, curve, summary = train(cfg, corpus)
    out, docs = REPO / cfg.out, REPO / cfg.docs
    record = dict(
        python=platform.python_version(),
        python_implementation=platform.python_implementation(),
        versions={m.__name__: m.__version__ for m in (jax, flax, optax, np)},
        command=" ".join(["python", *sys.argv]),
        corpus=corpus.record(),
        train_config=dataclasses.asdict(cfg),
        num_parameters=sum(int(x.size) for x in jax.tree.leaves(nnx.state(model))),
        results=summary,
    )
    write_checkpoint(model, out, record)
    record["samples"] = samples(out, cfg.sample_tokens)
    record["results"]["total_wall_seconds"] = time.time() - started
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    write_curve(curve, docs)
    print(json.dumps(record["results"], indent=2))
    for text in record["samples"].values():
        print("-" * 60 + "\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
