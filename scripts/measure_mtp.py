"""Acceptance of the `stdlib` preset's MTP drafts, measured with the real engine on held-out text.

    python scripts/measure_mtp.py          # re-measure the preset; updates training.json

Greedy generation from prompts cut from the held-out files (`stdlib_corpus.py`) at line starts,
evenly spaced, once without speculation and once with `SpeculativeConfig("mtp", K)` per K: the
engine's acceptance rate (accepted over drafted drafts), mean acceptance length (1 + accepted
drafts per row that carried drafts) and step count, and whether every request's tokens equal
those without speculation. `train_mtp_head.py` calls it after writing the head.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
from stdlib_corpus import load_corpus

from jmamba.checkpoints.weights import load_pretrained
from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.core.speculative_config import SpeculativeConfig
from runtime.engine import Engine

PRESET = Path(__file__).resolve().parents[1] / "jmamba/presets/stdlib"
KS = (1, 2, 3)
MAX_NUM_SEQS = 8


def heldout_prompts(heldout: np.ndarray, count: int, length: int) -> list[list[int]]:
    """`count` prompts of `length` held-out tokens, each starting a line, evenly spaced."""
    after = np.flatnonzero(heldout[:-1] == ord("\n")) + 1
    starts = after[after <= heldout.size - length]
    picks = starts[np.linspace(0, starts.size - 1, count).astype(np.int64)]
    return [heldout[s : s + length].tolist() for s in picks]


def serve(model, prompts: list[list[int]], max_tokens: int, k: int | None) -> tuple[list, Engine]:
    config = EngineArgs(
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=max(len(p) for p in prompts) + max_tokens + 8,
        speculative=None if k is None else SpeculativeConfig("mtp", k),
    )
    engine = Engine(model, config)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, params, request_id=i)
    outputs = {}
    while engine.has_unfinished:
        outputs |= {o.request_id: o.token_ids for o in engine.step()}
    return [outputs[str(i)] for i in range(len(prompts))], engine


def measure_acceptance(
    preset: Path, heldout: np.ndarray, *, num_prompts: int, prompt_len: int, max_tokens: int
) -> dict:
    """Per K, what the engine measured (module docstring), over `num_prompts` held-out prompts of
    `prompt_len` tokens, each generating `max_tokens`."""
    model = load_pretrained(preset)
    prompts = heldout_prompts(heldout, num_prompts, prompt_len)
    start = time.time()
    plain, engine = serve(model, prompts, max_tokens, None)
    result = dict(
        prompts=len(prompts),
        prompt_tokens=prompt_len,
        max_tokens=max_tokens,
        generated_tokens=sum(len(t) for t in plain),
        steps_without_speculation=engine.stats.num_steps,
        per_k={},
    )
    for k in KS:
        tokens, engine = serve(model, prompts, max_tokens, k)
        spec = engine.stats.speculation
        result["per_k"][str(k)] = dict(
            acceptance_rate=spec.acceptance_rate,
            mean_acceptance_length=spec.mean_acceptance_length,
            num_drafted=spec.num_drafted,
            num_accepted=spec.num_accepted,
            num_rows=spec.num_rows,
            steps=engine.stats.num_steps,
            tokens_equal_without_speculation=tokens == plain,
            requests_equal=sum(a == b for a, b in zip(tokens, plain, strict=True)),
        )
        print(f"mtp K={k}: {result['per_k'][str(k)]}", flush=True)
    result["wall_seconds"] = time.time() - start
    return result


def main() -> int:
    record = json.loads((PRESET / "training.json").read_text())
    section = record["mtp_head"]
    cfg = section["train_config"]  # the measure_* knobs of train_mtp_head.HeadConfig
    section["acceptance"] = measure_acceptance(
        PRESET,
        load_corpus().heldout,
        num_prompts=cfg["measure_prompts"],
        prompt_len=cfg["measure_prompt_len"],
        max_tokens=cfg["measure_tokens"],
    )
    (PRESET / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(section["acceptance"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
