"""The P/D example proposed for the README's "Beyond one machine" section, run as the README test
runs its Python blocks (verbatim, from a directory outside the repository), then checked against
one engine serving the same prompt. Slow tier: the quick tests cover the same path."""

from __future__ import annotations

import contextlib
import io
import tempfile

from tests.tiers import slow

EXAMPLE = """\
import jmamba
from runtime import Engine, EngineArgs, SamplingParams
from runtime.disagg import DecodeInstance, PrefillInstance, QueueTransport

model, _ = jmamba.load_model("tiny-nemotron_h")  # Mamba2 + attention: KV blocks and a state
args = EngineArgs(max_num_seqs=2, max_model_len=64, block_size=8)
link = QueueTransport()  # both ends in one process; two processes: local_pair(), listen/connect
prefill = PrefillInstance(Engine(model, args), link)
decode = DecodeInstance(Engine(model, args), link)

prefill.add_request([1, 2, 3, 4, 5], SamplingParams(max_tokens=8, ignore_eos=True))
prefill.step()  # the prompt, its first token, then the hand-over: blocks + state slot
print(decode.receive().admitted)  # ['0']: a running decode there, nothing recomputed
while decode.engine.has_unfinished:
    for output in decode.engine.step():
        print(output.token_ids)  # 8 tokens, those one engine gives
"""


@slow
def test_the_readme_example_decodes_what_one_engine_does():
    namespace: dict = {}
    printed = io.StringIO()
    with tempfile.TemporaryDirectory() as elsewhere, contextlib.chdir(elsewhere):
        with contextlib.redirect_stdout(printed):
            exec(compile(EXAMPLE, "README.md", "exec"), namespace)
    admitted, tokens = printed.getvalue().splitlines()
    assert admitted == "['0']"
    one = namespace["Engine"](namespace["model"], namespace["args"])  # prefills and decodes
    one.add_request([1, 2, 3, 4, 5], namespace["SamplingParams"](max_tokens=8, ignore_eos=True))
    outputs = []
    while one.has_unfinished:
        outputs += one.step()
    (output,) = outputs
    assert tokens == str(output.token_ids) and len(output.token_ids) == 8
