"""`WeightMultipliers`: a checkpoint's constant multipliers inside its layers' linear maps, which
the loader folds into the weights (`jmamba.checkpoints.folding`); `ModelConfig.multipliers` holds
them."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class WeightMultipliers:
    """Constant multipliers of a checkpoint (Falcon-H1's muP ones), folded into the weights at load
    time (`jmamba.checkpoints.weights`): the model holds `multiplier x weight` and never reads these
    fields, so a step pays nothing for them and all 1.0 (the default) is a plain checkpoint. Each
    scales the output of one linear map of every layer that has it (the multiplier on a map's input
    is the same as one on its output):

      attention_in: q, k and v (their projection kernels).
      attention_key: k, before RoPE, which is linear (k_proj).
      attention_out: the attention output (o_proj).
      mamba2_in: the whole Mamba2 in_proj output.
      mamba2_segments: (z, x, B, C, dt), each segment of the Mamba2 in_proj output; x, B and C
        before the conv, which is linear in them (its bias is not scaled), dt before dt_bias.
      mamba2_out: the Mamba2 output (out_proj).
      mlp_gate, mlp_down: the dense SwiGLU MLP's gate before its silu (gate_proj) and its output
        (down_proj); MoE experts have none.
    """

    attention_in: float = 1.0
    attention_key: float = 1.0
    attention_out: float = 1.0
    mamba2_in: float = 1.0
    mamba2_segments: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0)  # five: checked below
    mamba2_out: float = 1.0
    mlp_gate: float = 1.0
    mlp_down: float = 1.0

    def __post_init__(self) -> None:
        if len(self.mamba2_segments) != 5:
            raise ValueError(
                f"mamba2_segments={self.mamba2_segments} needs one multiplier per (z, x, B, C, dt)"
            )
        values = [v for v in dataclasses.astuple(self) if not isinstance(v, tuple)]
        values += list(self.mamba2_segments)
        if not all(math.isfinite(v) and v != 0.0 for v in values):
            raise ValueError(f"weight multipliers must be finite and non-zero, got {self}")
