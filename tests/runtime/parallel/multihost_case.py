"""The shared workload of the multi-host test: prompts, budgets and engine options."""

import numpy as np

PROMPTS = [
    np.random.default_rng(i).integers(0, 256, n).tolist()
    for i, n in enumerate((3, 30, 11, 1, 25, 7))
]
MAX_TOKENS = 5
OPTIONS = dict(
    data_parallel_size=4,
    max_num_seqs=2,
    max_num_batched_tokens=32,
    max_model_len=64,
    block_size=8,
    validate_inputs=True,
)
