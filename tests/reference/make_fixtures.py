"""Regenerate the HF-transformers reference fixtures under tests/fixtures/<family>/.

Run with the separate Python 3.11 env (torch 2.13.0 CPU, transformers 5.23.0), never from the
library or from pytest:

    HF_HUB_OFFLINE=1 /work/tfvenv/bin/python tests/reference/make_fixtures.py [--list] [family ...]

For each family it builds a tiny random float32 model, adds noise to every parameter (and to the
MoE router correction-bias buffer) so no weight sits at its trivial init value, saves it with
`save_pretrained` (config.json + model.safetensors) and writes expected.npz: full-sequence logits,
cached chunked-prefill + decode logits, and the conv / recurrent states of every recurrent layer
after the chunked run. See tests/reference/README.md for the array meanings and layouts.

The multimodal wrappers (`qwen3_5_vl`, `qwen3_5_moe_vl`) record the logits of text-only input (no
pixel values); `check_text_model` asserts they are those of the text model's own `...ForCausalLM`
on the wrapper's language-model weights.

The `*_mtp` families (`qwen3_next_mtp`, `qwen3_5_mtp`) add a multi-token-prediction head built from
transformers' modules (mtp_runs.py): its `mtp.*` tensors go into model.safetensors, its layer-count
field into config.json, its one-shot and chained-draft arrays into expected.npz.

The families are defined in fixture_families.py, the HF forwards in hf_runs.py and the MoE routing
gap in router_margins.py (beside this file, imported by name: the script runs from any directory).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from fixture_families import FAMILIES  # noqa: E402
from hf_runs import chunked_logits, full_logits, make_tokens, perturb, recurrent_states  # noqa: E402
from mtp_runs import build_head, check_head_reload, run_mtp, write_mtp  # noqa: E402
from router_margins import MIN_MARGIN, routing_margin  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

torch.set_num_threads(1)  # thread oversubscription makes tiny models 100x slower on this box
transformers.logging.set_verbosity_error()  # silence the "falling back to PyTorch" warnings
transformers.logging.disable_progress_bar()

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOKEN_SEED = 1234
TOL = 1e-4


def build(family: str, seqs: list[np.ndarray]) -> tuple[torch.nn.Module, list[int], float]:
    """The perturbed eval-mode model of a family, its recurrent HF layer indices, its routing gap.

    The noise seed is the first of 1, 2, ... whose model has no MoE near-tie on seqs (see
    router_margins.py), so the fixtures stay deterministic and parity tests cannot flip experts.
    """
    cls, cfg = FAMILIES[family].make()
    for seed in range(1, 21):
        torch.manual_seed(0)
        model = cls(cfg).float().eval()
        perturb(model, seed=seed)
        margin = routing_margin(model, seqs)
        if margin > MIN_MARGIN:
            print(f"{family:15s} noise seed {seed}")
            break
    else:
        raise AssertionError(f"{family}: every seed has a router near-tie (last {margin:.2e})")
    # Falcon-H1's "hybrid" layers run a Mamba2 mixer beside their attention, Zamba2's after a
    # shared transformer block.
    layer_types = model.config.get_text_config().layer_types
    recurrent = [i for i, t in enumerate(layer_types) if t in ("linear_attention", "hybrid")]
    return model, recurrent, margin


def make_family(family: str) -> dict[str, float]:
    """Save one family's model and expected.npz; returns the max chunked-vs-full diffs."""
    spec = FAMILIES[family]
    seq_a, seq_b = make_tokens(TOKEN_SEED, spec.len_a, spec.len_b)
    diffs: dict[str, float] = {}
    model, recurrent, diffs["margin"] = build(family, [seq_a, seq_b])
    out_dir = FIXTURES / family
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "generation_config.json").unlink(missing_ok=True)
    if spec.packed_experts:  # the in-memory names: experts packed, as published
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(state, out_dir / "model.safetensors", metadata={"format": "pt"})
    mtp_arrays: dict[str, np.ndarray] = {}
    if spec.mtp_config is not None:  # the MTP head on the first sequence (mtp_runs.py)
        head, diffs["mtp_margin"] = build_head(model, seq_a)
        write_mtp(head, model, out_dir, spec.mtp_config, packed=spec.packed_experts)
        mtp_arrays = run_mtp(head, model, seq_a)

    arrays: dict[str, np.ndarray] = {"seq_a": seq_a, "seq_b": seq_b}
    for tag, seq, chunks in (("a", seq_a, spec.chunks_a), ("b", seq_b, spec.chunks_b)):
        full = full_logits(model, seq)
        chunked, cache = chunked_logits(model, seq, chunks)
        diffs[tag] = float(np.abs(full - chunked).max())
        assert diffs[tag] < TOL, f"{family} seq_{tag}: chunked vs full {diffs[tag]:.2e}"
        arrays[f"logits_full_{tag}"] = full.astype(np.float32)
        arrays[f"logits_chunked_{tag}"] = chunked.astype(np.float32)
        arrays.update(recurrent_states(cache, recurrent, tag))
        arrays[f"chunks_{tag}"] = np.asarray(chunks, dtype=np.int32)
    arrays["recurrent_layers"] = np.asarray(recurrent, dtype=np.int32)
    arrays.update(mtp_arrays)
    np.savez(out_dir / "expected.npz", **arrays)
    check_reload(model, out_dir, seq_b, arrays["logits_full_b"], spec.reload_tol)
    if mtp_arrays:
        check_head_reload(model, out_dir, seq_a, mtp_arrays, spec.reload_tol)
    if spec.text_class is not None:
        diffs["text"] = check_text_model(model, spec.text_class, arrays)
    return diffs


def check_text_model(model: torch.nn.Module, text_class: type, arrays: dict) -> float:
    """The wrapper's recorded text-only logits are those of `text_class` (the text model's own
    `...ForCausalLM`) on the wrapper's language-model weights; returns the max difference."""
    text_config = model.config.get_text_config()
    text_config.tie_word_embeddings = model.config.tie_word_embeddings
    text = text_class(text_config).float().eval()
    renamed = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("model.language_model."):
            renamed["model." + name.removeprefix("model.language_model.")] = tensor
        elif name == "lm_head.weight":
            renamed[name] = tensor
    missing, unexpected = text.load_state_dict(renamed, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if text_config.tie_word_embeddings:
        assert text.lm_head.weight.data_ptr() == text.model.embed_tokens.weight.data_ptr()
    diff = max(
        float(np.abs(full_logits(text, arrays[f"seq_{tag}"]) - arrays[f"logits_full_{tag}"]).max())
        for tag in ("a", "b")
    )
    assert diff <= 1e-6, f"{text_class.__name__} differs from the wrapper's logits by {diff:.2e}"
    return diff


def check_reload(
    model: torch.nn.Module, out_dir: Path, seq: np.ndarray, ref: np.ndarray, tol: float = 0.0
) -> None:
    """The saved checkpoint must reload (disk -> memory conversion) to the same logits (within
    the fixture's `reload_tol`)."""
    reloaded = type(model).from_pretrained(out_dir).eval()
    diff = float(np.abs(full_logits(reloaded, seq) - ref).max())
    assert diff <= tol, f"{out_dir.name}: reload changed logits by {diff:.2e}"


def tensor_listing(path: Path) -> list[str]:
    """On-disk tensor names and shapes, layer / expert indices folded into {i} / {e}."""
    rows: dict[tuple[str, tuple[int, ...]], set[int]] = {}
    with safe_open(str(path), "pt") as f:
        for key in f.keys():
            shape = tuple(f.get_slice(key).get_shape())
            m = re.match(r"(.*?layers\.)(\d+)\.(.*)", key)
            if m is None:
                rows.setdefault((key, shape), set())
                continue
            rest = re.sub(r"experts\.\d+\.", "experts.{e}.", m.group(3))
            rows.setdefault((f"{m.group(1)}{{i}}.{rest}", shape), set()).add(int(m.group(2)))
    return [
        f"{name} {list(shape)}" + (f"  i={sorted(layers)}" if layers else "")
        for (name, shape), layers in sorted(rows.items())
    ]


def main(argv: list[str]) -> None:
    """Regenerate the families named in argv (all when none)."""
    show = "--list" in argv
    families = [a for a in argv if a != "--list"] or list(FAMILIES)
    print(f"torch {torch.__version__}  transformers {transformers.__version__}")
    for family in families:
        diffs = make_family(family)
        sizes = {p.name: p.stat().st_size for p in sorted((FIXTURES / family).iterdir())}
        text = f"text-model={diffs['text']:.1e}  " if "text" in diffs else ""
        if "mtp_margin" in diffs:
            text += f"mtp-route-gap={diffs['mtp_margin']:.1e}  "
        print(
            f"{family:15s} chunked-vs-full a={diffs['a']:.2e} b={diffs['b']:.2e} "
            f"route-gap={diffs['margin']:.1e}  {text}"
            + " ".join(f"{k}={v}" for k, v in sizes.items())
        )
        if show:
            for row in tensor_listing(FIXTURES / family / "model.safetensors"):
                print("    " + row)


if __name__ == "__main__":
    main(sys.argv[1:])
