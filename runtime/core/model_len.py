"""`max_model_len` when the user gives none, and the KV pool a config gets without memory sizing.

The rule (`EngineArgs.max_model_len` says it to users):

- no max_model_len given: the checkpoint's `max_position_embeddings`; a host-only config that
  knows no checkpoint (scheduler tests) gets `DEFAULT_MAX_MODEL_LEN`;
- a given max_model_len above the checkpoint's is refused (ValueError naming both);
- without `gpu_memory_utilization`, num_blocks defaults to room for max_num_seqs requests of
  max_model_len when max_model_len was given (as always), and of at most
  `DEFAULT_POOL_MODEL_LEN` tokens when it defaulted to the checkpoint's (yet never less than one
  request of the full length): a 262144-token checkpoint does not make a pool of max_num_seqs
  such requests that nobody asked for. With memory sizing the pool is what memory allows.
"""

from __future__ import annotations

import math

from runtime.core import checks

# The length a config without a checkpoint gets (host-only configs; what every config got before
# the checkpoint's limit was the default).
DEFAULT_MAX_MODEL_LEN = 512
# Without memory sizing, a defaulted max_model_len sizes the KV pool for requests of at most this.
DEFAULT_POOL_MODEL_LEN = 512


def resolve_max_model_len(given: int | None, max_position_embeddings: int | None) -> int:
    """The max_model_len a config runs with: `given`, else the checkpoint's
    `max_position_embeddings`, else `DEFAULT_MAX_MODEL_LEN` (no checkpoint known). ValueError when
    `given` exceeds the checkpoint's."""
    if max_position_embeddings is not None:
        checks.integer("max_position_embeddings", max_position_embeddings, low=2)
    if given is None:
        return DEFAULT_MAX_MODEL_LEN if max_position_embeddings is None else max_position_embeddings
    if max_position_embeddings is not None and given > max_position_embeddings:
        raise ValueError(
            f"max_model_len={given} is larger than the checkpoint's max_position_embeddings="
            f"{max_position_embeddings}: give max_model_len <= {max_position_embeddings}, or "
            "none to use the checkpoint's"
        )
    return given


def blocks_per_seq(max_model_len: int, block_size: int) -> int:
    """KV blocks one request of max_model_len tokens needs (the width of a block-table row)."""
    return math.ceil(max_model_len / block_size)


def default_num_blocks(
    max_num_seqs: int, max_model_len: int, block_size: int, *, defaulted: bool
) -> int:
    """num_blocks (NULL included) of a config that sizes its pool without memory: room for
    max_num_seqs requests of max_model_len, or with a `defaulted` max_model_len of
    min(max_model_len, DEFAULT_POOL_MODEL_LEN) tokens, and at least one request of the full
    length."""
    pool_len = min(max_model_len, DEFAULT_POOL_MODEL_LEN) if defaulted else max_model_len
    per_seq = blocks_per_seq(pool_len, block_size)
    return max(max_num_seqs * per_seq, blocks_per_seq(max_model_len, block_size)) + 1
