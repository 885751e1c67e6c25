"""Prefill/decode disaggregation: one engine computes prompts, another decodes them, and each
request crosses between them with its attention KV blocks and its recurrent state slot, bitwise.

One noun a module: `handover.py` (the record and its wire form), `fingerprint.py` (what both
engines must share), `transport.py` (the interface, `TransferError`), `local.py` (a
`multiprocessing` connection: pipe or local socket), `nixl.py` (NIXL, imported only when made;
untested), `pool_rows.py` (a request's rows of every cache pool, read and written on the
device), `export.py` and `admission.py` (the engine side of each end), `prefill_instance.py` and
`decode_instance.py` (an engine with its end of the link). The engine itself has no branch for
it: a prefill instance reads a request's rows between steps and aborts it, a decode instance
enters it through `Scheduler.enter_computed`, and from then on it is a plain running request.

Where the first token comes from, and why the decode side recomputes nothing. The prefill
engine feeds the whole prompt, N tokens, and samples the first output token in the same step,
exactly as one engine would (the same program, so the same token, sampled with the request's
seed at output index 0). It hands over the state after N tokens and that token; the decode
engine enters the request with `num_computed = N` and the token as its first output, so its
first step is an ordinary decode row feeding it. vLLM's NixlConnector does otherwise for
attention (the decode side recomputes the last prompt token to get logits), and for Mamba
hybrids it had to prefill only N - 1 tokens on the prefill side so that the decode side's
recompute of token N did not apply it twice (vllm#37310), which then needed that one-token
"prefill" to run as a decode (vllm#42430) and broke again when speculative decoding padded it
(vllm#55178). A recurrent state cannot be rolled back by dropping a token, so every such
mismatch corrupts it silently. Sending the sampled token as SGLang does (its decode side starts
from the prefill's output ids) removes the recompute and the whole class: the decode side's
state is, bitwise, the one the prefill wrote, and its first step is a decode like every other.
"""

from __future__ import annotations

from runtime.disagg.decode_instance import Arrivals, DecodeInstance
from runtime.disagg.fingerprint import Fingerprint
from runtime.disagg.handover import Handover
from runtime.disagg.local import (
    ConnectionTransport,
    QueueTransport,
    accept,
    connect,
    listen,
    local_pair,
)
from runtime.disagg.prefill_instance import PrefillInstance, PrefillStep
from runtime.disagg.transport import FailedRequest, TransferError, Transport

__all__ = [
    "Arrivals",
    "ConnectionTransport",
    "DecodeInstance",
    "FailedRequest",
    "Fingerprint",
    "Handover",
    "PrefillInstance",
    "PrefillStep",
    "QueueTransport",
    "TransferError",
    "Transport",
    "accept",
    "connect",
    "listen",
    "local_pair",
]
