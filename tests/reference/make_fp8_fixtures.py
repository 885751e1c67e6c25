"""Write FP8 versions of the committed float32 fixtures, by hand: each family in each published
layout (Qwen's block-wise `fp8`, compressed-tensors per channel and per tensor, ModelOpt FP8),
beside the fp32 checkpoint of the weights they dequantize to.

    .venv/bin/python -m tests.reference.make_fp8_fixtures /tmp/fp8 [family ...]

The tests write the same pairs into their tmp_path (`tests/jmamba/quantization/fp8_writer.py`,
which does the work: numpy, ml_dtypes and safetensors only), so nothing is committed; this script
is for looking at them, or for loading them elsewhere (transformers' FP8 quantizer, vLLM). Not
collected by pytest (its name is not `test_*.py`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.jmamba.quantization.fp8_writer import block_fp8, compressed_tensors, modelopt, write_pair

FORMATS = {
    "fp8": block_fp8(),
    "fp8_packed": block_fp8(packed_experts=True),
    "ct_channel": compressed_tensors("channel"),
    "ct_tensor": compressed_tensors("tensor"),
    "modelopt": modelopt(),
}
FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "nemotron_h", "mamba2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "out", type=Path, help="directory to write <family>/<format>/{fp8,reference}"
    )
    parser.add_argument("families", nargs="*", default=FAMILIES)
    args = parser.parse_args()
    for family in args.families:
        for name, fmt in FORMATS.items():
            fp8, reference = write_pair(family, fmt, args.out / family / name)
            print(f"{fp8}  (reference: {reference})")


if __name__ == "__main__":
    main()
