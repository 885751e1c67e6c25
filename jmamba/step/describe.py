"""One-line descriptions of a `StepInputs` for notebooks and logs (numpy only, no jax).

`describe_step_inputs` is what `repr(StepInputs)` should print: the dataclass default prints
every array in full. (`jmamba/step/inputs.py` can bind it as `__repr__`.)
"""

from __future__ import annotations

import numpy as np

from jmamba.step.inputs import StepInputs


def describe_step_inputs(inputs: StepInputs) -> str:
    """Shape and live content of a step: tokens, decode rows x lanes, prefill rows and tokens.

    Live rows are those with a query length; their slots and lengths are listed, padding is
    counted only.
    """
    decode, prefill = inputs.decode, inputs.prefill
    query_lens = np.asarray(decode.query_lens)
    live_decode = np.nonzero(query_lens > 0)[0]
    qsl = np.asarray(prefill.query_start_loc)
    prefill_lens = np.diff(qsl) if qsl.size else np.zeros(0, np.int64)
    live_prefill = np.nonzero(prefill_lens > 0)[0]
    read = np.asarray(decode.read_slots)[live_decode].tolist()
    p_read = np.asarray(prefill.read_slots)[live_prefill].tolist()
    p_write = np.asarray(prefill.write_slots)[live_prefill].tolist()
    p_computed = np.asarray(prefill.num_computed)[live_prefill].tolist()
    return (
        f"StepInputs({inputs.num_tokens} tokens; "
        f"decode {decode.num_rows}x{decode.width}: {live_decode.size} live, slots {read}; "
        f"prefill {prefill.num_rows} rows/{inputs.num_prefill_tokens} tokens: "
        f"{live_prefill.size} live, lengths {prefill_lens[live_prefill].tolist()}, "
        f"computed {p_computed}, read {p_read}, write {p_write}; "
        f"{np.asarray(inputs.logits_indices).size} logits)"
    )
