"""`Fp8Plan`: which of a model's linear layers hold FP8 kernels, in which scale layout, and why
the others that a checkpoint quantizes stay dequantized (`ModelConfig.quantization`).

`HybridLM` builds every projection as a `Linear`, then swaps the plan's paths for `Fp8Linear`s
(`jmamba.layers.fp8_linear.with_fp8_linears`), so the layers' code never sees the plan. The loader
makes the plan (`jmamba.checkpoints.quantization.fp8_params`): from an FP8 checkpoint's weights,
or for every dense projection under `quantization="fp8"`. `NO_FP8`, the default, plans nothing.
"""

from __future__ import annotations

import dataclasses

Path_ = tuple[str | int, ...]
Block = tuple[int, int]  # entries per scale along (in, out) of an [in, out] kernel; 0: the axis


@dataclasses.dataclass(frozen=True)
class Fp8Plan:
    """Attributes:
    layers: (module path, block) of each `Fp8Linear`, e.g. (("layers", 0, "mixer", "in_proj"),
      (128, 128)); block as `jmamba.layers.fp8_linear` reads it ((0, 1): per output channel).
    dequantized: (parameter path, reason) of each parameter built from FP8 weights that stays
      dequantized (expert stacks, folded multipliers or LoRA adapters, concatenated tensors).
    scheme: one line saying what the FP8 weights are (`Fp8Scheme.describe`, or the dynamic
      quantization's), "unquantized" for no plan.
    """

    layers: tuple[tuple[Path_, Block], ...] = ()
    dequantized: tuple[tuple[Path_, str], ...] = ()
    scheme: str = "unquantized"

    @property
    def active(self) -> bool:
        """Whether any layer holds an FP8 kernel."""
        return bool(self.layers)


NO_FP8 = Fp8Plan()
