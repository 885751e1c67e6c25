"""P/D over two processes: this one prefills, a spawned one decodes, the hand-overs crossing a
pipe as bytes (`runtime.disagg.local`). The decode process's tokens and rows (after the
hand-over and after its own decode steps) equal, bitwise, those of one engine computing the same
prompts here, and both sides' pools end as they began."""

from __future__ import annotations

import multiprocessing

from runtime.disagg import PrefillInstance, local_pair
from tests.runtime.disagg import decode_process
from tests.runtime.disagg.pairs import (
    PARAMS,
    PROMPTS,
    assert_bitwise,
    family,
    free_counts,
    reference,
)

NAME = "nemotron_h"  # Mamba2 + attention: both kinds of rows cross


def test_decode_in_another_process_continues_bitwise():
    context = multiprocessing.get_context("spawn")  # jax's threads do not survive a fork
    prefill_end, decode_end = local_pair()
    results, results_end = context.Pipe(duplex=False)
    child = context.Process(
        target=decode_process.serve,
        args=(NAME, decode_end.connection, results_end, len(PROMPTS)),
        daemon=True,
    )
    child.start()  # it builds its engine while this one computes the reference
    try:
        want = reference(NAME)
        fam = family(NAME)
        prefill = PrefillInstance(fam.engine(fam.a), prefill_end)
        start = free_counts(prefill.engine)
        ids = [prefill.add_request(p, PARAMS) for p in PROMPTS]
        step = prefill.step()
        assert [h.request_id for h in step.sent] == ids and not step.failed
        assert free_counts(prefill.engine) == start
        assert results.poll(300), "the decode process sent nothing back"
        begun, after_prompt, after_decodes, tokens, ended = results.recv()
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    for i in ids:
        assert_bitwise(after_prompt[i], want.after_prompt[i])
        assert_bitwise(after_decodes[i], want.after_decodes[i])
    assert tokens == want.tokens
    assert ended == begun
