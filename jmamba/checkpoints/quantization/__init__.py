"""The published FP8 checkpoint formats, read as they sit on disk: `scheme` (`Fp8Scheme`, what a
`quantization_config` says), one parser per format (`block_fp8`: Qwen's and DeepSeek's `fp8`,
`compressed_tensors`, `modelopt`), `registry` (`load_scheme`: a checkpoint directory's scheme),
`dequantization` (a weight's fp32 values from its e4m3 entries and scales) and `quantized_tensors`
(which tensors are FP8 weights, which scales they read, and the refusals)."""
