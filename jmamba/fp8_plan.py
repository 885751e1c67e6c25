"""`Fp8Plan`: which of a model's linear layers hold FP8 kernels, in which scale layout, why the
others that a checkpoint quantizes stay dequantized, and the KV-cache scales of its attention
layers (`ModelConfig.quantization`).

`HybridLM` builds every projection as a `Linear`, then swaps the plan's paths for `Fp8Linear`s
(`jmamba.layers.fp8_linear.with_fp8_linears`) and the plan's MoEs' expert stacks for e4m3 ones
(`jmamba.layers.fp8_experts.with_fp8_experts`), so the layers' code never sees the plan. The loader
makes the plan (`jmamba.checkpoints.quantization.fp8_params`): from an FP8 checkpoint's weights,
or for every dense projection under `quantization="fp8"`. The attention layers take their KV-cache
scales the same way (`jmamba.mixers.attention.with_kv_scales`). `NO_FP8`, the default, plans
nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

Path_ = tuple[str | int, ...]
Block = tuple[int, int]  # entries per scale along (in, out) of an [in, out] kernel; 0: the axis
KvScales = tuple[tuple[Path_, float, float], ...]  # (attention module path, k_scale, v_scale)


@dataclasses.dataclass(frozen=True)
class Fp8Plan:
    """Attributes:
    layers: (module path, block) of each `Fp8Linear`, e.g. (("layers", 0, "mixer", "in_proj"),
      (128, 128)); block as `jmamba.layers.fp8_linear` reads it ((0, 1): per output channel).
    dequantized: (parameter path, reason) of each parameter built from FP8 weights that stays
      dequantized (expert stacks, folded multipliers or LoRA adapters, concatenated tensors).
    scheme: one line saying what the FP8 weights are (`Fp8Scheme.describe`, or the dynamic
      quantization's), "unquantized" for no plan.
    experts: (module path, block) of each MoE whose expert stacks stay e4m3
      (`jmamba.layers.fp8_experts`), e.g. (("layers", 1, "ffn"), (128, 128)), block as
      `layers` reads it.
    kv_scales: (module path, k_scale, v_scale) of each attention layer whose checkpoint holds
      KV-cache scales (`jmamba.checkpoints.quantization.kv_scales`), read by an FP8 KV cache
      only; a layer not listed keeps 1.0.
    """

    layers: tuple[tuple[Path_, Block], ...] = ()
    dequantized: tuple[tuple[Path_, str], ...] = ()
    scheme: str = "unquantized"
    experts: tuple[tuple[Path_, Block], ...] = ()
    kv_scales: KvScales = ()

    @property
    def active(self) -> bool:
        """Whether any layer holds an FP8 kernel (a dense one or an expert stack)."""
        return bool(self.layers or self.experts)


NO_FP8 = Fp8Plan()


def module_at(root: Any, path: Path_) -> Any:
    """The module at `path` under `root` (attribute names, and indices into lists of layers), or
    None where a part is missing (a part the model was built without, such as a dropped MTP
    head)."""
    node = root
    for part in path:
        node = node[part] if isinstance(part, int) else getattr(node, part, None)
        if node is None:
            return None
    return node
