"""`Fp8Scheme`: what a checkpoint's `quantization_config` says about its FP8 weights, whatever the
format that wrote it (`jmamba.checkpoints.quantization.registry` parses each).

Every published FP8 form stores a quantized linear as `<linear>.weight` in float8_e4m3fn, [out, in]
(or `[E, out, in]` for packed experts), beside its scales: one fp32 (or bf16) scale per block of
`block` entries, where a block side of 0 spans the whole axis, so per-tensor scales are
`block = (0, 0)`, per-output-channel ones `(1, 0)` and Qwen's / DeepSeek's 128 x 128 tiles
`(128, 128)`. The weight's value is its e4m3 entry times its block's scale. Which modules a
checkpoint keeps unquantized is read from the tensors' dtypes on disk; the config's own list
(`kept`) is recorded as written.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Fp8Scheme:
    """The FP8 weights of one checkpoint.

    Attributes:
      method: the config's `quant_method` ("fp8", "compressed-tensors", "modelopt"), or "none"
        for a checkpoint without a `quantization_config` (it may hold no FP8 tensor).
      block: (rows, cols) of weight entries sharing one scale; 0 spans the whole axis.
      scale_suffix: a weight `<linear>.weight` has its scales in `<linear>.<scale_suffix>`
        (packed experts `<p>.experts.<proj>` in `<p>.experts.<proj>_<suffix without weight_>`).
      static_inputs: each quantized linear also holds its calibrated activation scale,
        `<linear>.input_scale` (read for the FP8 matmul; a weight-dequantising load has no use
        for it).
      kv_cache_scales: the checkpoint may hold the attention layers' `k_scale` / `v_scale` (for
        an FP8 KV cache).
      kept: the modules the config lists as left unquantized, as written (names, patterns).
      activations: how the FP8 matmul quantizes its input ("dynamic per token", "static per
        tensor", "none": weight-only).
    """

    method: str
    block: tuple[int, int] = (0, 0)
    scale_suffix: str = "weight_scale"
    static_inputs: bool = False
    kv_cache_scales: bool = False
    kept: tuple[str, ...] = ()
    activations: str = "dynamic per token"

    def __post_init__(self) -> None:
        if len(self.block) != 2 or any(side < 0 for side in self.block):
            raise ValueError(f"block={self.block} must be two sizes >= 0 (0: the whole axis)")

    @property
    def quantized(self) -> bool:
        """Whether the config declares FP8 weights at all."""
        return self.method != "none"

    def scale_name(self, weight: str) -> str:
        """The scale tensor of the quantized tensor `weight`."""
        if weight.endswith(".weight"):
            return f"{weight.removesuffix('.weight')}.{self.scale_suffix}"
        return f"{weight}_{self.scale_suffix.removeprefix('weight_')}"  # packed experts

    def input_scale_name(self, weight: str) -> str:
        """The static activation scale of the quantized tensor `weight`."""
        return f"{weight.removesuffix('.weight')}.input_scale"

    def describe(self) -> str:
        """One line for logs and `print(llm)`, e.g. "fp8 e4m3 weights per 128x128 block, dynamic
        per 1x128 group activations"."""
        if not self.quantized:
            return "unquantized"
        rows, cols = self.block
        weights = {(0, 0): "tensor", (1, 0): "channel"}.get(self.block, f"{rows}x{cols} block")
        return f"{self.method} e4m3 weights per {weights}, {self.activations} activations"


NO_QUANTIZATION = Fp8Scheme("none")
