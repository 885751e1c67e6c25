"""Hugging Face checkpoints in and out: `config.json` adapters (`families/`), which tensor makes
which parameter (`name_map`, `source`, `folding`), what is skipped or packed (`skipped_tensors`),
the safetensors files (`files`, `reader`), whole loads and saves (`weights`), one tensor-parallel
shard at a time (`shards`) and hub ids (`hub`)."""
