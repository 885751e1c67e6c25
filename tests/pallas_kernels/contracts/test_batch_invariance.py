"""A row's outputs and states do not depend on the rest of its batch (architecture.md 5.8).

For every stateful kernel (interpret mode): one row run inside a batch (at another row index and
token offset, beside rows of other lengths, padding rows and padding tokens, a larger padded
shape) and the same row run alone give BITWISE identical outputs and written states. The kernels'
arithmetic is row-local, so nothing weaker is acceptable: arithmetic that changed with the padded
shape or with the other rows (block sizes, split paths, an algorithm switch) would fail here.
"""

from __future__ import annotations

import numpy as np
import pytest

from pallas_kernels import ops
from tests.pallas_kernels.conv import test_causal_conv1d as conv
from tests.pallas_kernels.gdn import test_gdn_chunk as gdnc
from tests.pallas_kernels.gdn import test_gdn_state_update as gdnu
from tests.pallas_kernels.ssd import test_ssd_chunk_scan as scan
from tests.pallas_kernels.ssd import test_ssd_state_update as ssu

# How each argument is laid out: per flat token, per row, or neither (weights, the state pool).
TOKEN, ROW, QSL, OTHER = "token", "row", "qsl", "other"


def alone(args: dict, kinds: dict[str, str], r: int, pad_tokens: int = 2) -> dict:
    """Row r of a batch as a batch of its own: the row, one padding row, `pad_tokens` padding
    tokens (decode ops: the row and one padding row)."""
    out = {}
    qsl = args.get("query_start_loc")
    for name, kind in kinds.items():
        x = np.asarray(args[name])
        if kind == TOKEN:
            row = x[qsl[r] : qsl[r + 1]]
            out[name] = np.concatenate([row, np.zeros((pad_tokens, *x.shape[1:]), x.dtype)])
        elif kind == ROW:
            out[name] = np.stack([x[r], np.zeros_like(x[r])])
        elif kind == QSL:
            n = qsl[r + 1] - qsl[r]
            out[name] = np.array([0, n, n], x.dtype)
        else:
            out[name] = x
    return out


def assert_row_invariant(run, args: dict, kinds: dict[str, str], r: int, slots: list[int]):
    """run(args) -> (out, pool); row r's outputs and its `slots` match bitwise, alone vs batch."""
    out, pool = (np.asarray(a) for a in run(args))
    out1, pool1 = (np.asarray(a) for a in run(alone(args, kinds, r)))
    if "query_start_loc" in args:
        qsl = args["query_start_loc"]
        mine, mine1 = out[qsl[r] : qsl[r + 1]], out1[: qsl[r + 1] - qsl[r]]
    else:
        mine, mine1 = out[r], out1[0]
    assert mine.tobytes() == mine1.tobytes(), "the row's outputs depend on its batch"
    slots = [s for s in slots if s > 0]
    assert slots and pool[slots].tobytes() == pool1[slots].tobytes(), "states depend on the batch"


def test_conv_prefill():
    d = conv.prefill_inputs(11, (5, 9, 21, 1, 3), 20, 4, pad=7)
    d["has_initial_state"][2] = True
    kinds = dict.fromkeys(conv.PREFILL, OTHER) | {"x": TOKEN, "query_start_loc": QSL}
    kinds |= dict.fromkeys(("has_initial_state", "read_slots", "write_slots"), ROW)

    def run(a):
        return ops.causal_conv1d_prefill(*conv.prefill_args(a), implementation="interpret")

    assert_row_invariant(run, d, kinds, 2, [d["write_slots"][2]])


@pytest.mark.parametrize("algorithm", ["sequential", "parallel"])
def test_ssd_chunk_scan(algorithm):
    d = scan.make_inputs(12, (5, 9, 40, 1, 3), slots=24, num_computed=[3, 0, 13, 0, 7, 0])
    d["has_initial_state"][2] = True
    free = sorted(set(range(1, 24)) - set(d["read_slots"]) - set(d["write_slots"]))
    d["boundary_slots"] = np.zeros((6, 2), np.int32)
    d["boundary_slots"][2] = free[:2]  # slots no row reads or writes
    kinds = dict.fromkeys((*scan.ARGS, *scan.ROWS, *scan.OPTS), OTHER) | {"query_start_loc": QSL}
    kinds |= dict.fromkeys(("x", "dt", "B", "C", "z"), TOKEN)
    kinds |= dict.fromkeys(("num_computed", "has_initial_state", "read_slots", "write_slots"), ROW)
    kinds |= {"boundary_slots": ROW}

    def run(a):
        return scan.run(
            a,
            "interpret",
            chunk_size=16,
            block_size=16,
            boundary_slots=a["boundary_slots"],
            algorithm=algorithm,
        )

    assert_row_invariant(run, d, kinds, 2, [d["write_slots"][2], *free[:2]])


def test_gdn_chunk():
    lengths, nc = [5, 9, 40, 1, 3], [3, 0, 13, 0, 7]
    args, kw = gdnc.make_case(lengths, nc, [True] * 5, T=64, nb=2, bs=16, dims=(1, 2, 24, 12))
    names = (
        "q",
        "k",
        "v",
        "g",
        "beta",
        "state",
        "query_start_loc",
        "num_computed",
        "has_initial_state",
        "read_slots",
        "write_slots",
    )
    d = dict(zip(names, args, strict=True)) | {"boundary_slots": kw["boundary_slots"]}
    kinds = dict.fromkeys(("q", "k", "v", "g", "beta"), TOKEN) | {"state": OTHER}
    kinds |= {"query_start_loc": QSL} | dict.fromkeys(names[7:] + ("boundary_slots",), ROW)

    def run(a):
        rows = gdnc.as_rows([a[n] for n in names], 16, a["boundary_slots"])
        return ops.gdn_chunk(*rows, chunk_size=16, implementation="interpret")

    assert_row_invariant(run, d, kinds, 2, [d["write_slots"][2], *d["boundary_slots"][2]])


def test_conv_update():
    d = conv.update_inputs(13, 5, 3, 20, 4, slots=24)
    kinds = dict.fromkeys(conv.UPDATE, OTHER) | dict.fromkeys(
        ("x", "read_slots", "write_slots"), ROW
    )

    def run(a):
        return ops.causal_conv1d_update(*conv._args(a, conv.UPDATE), implementation="interpret")

    assert_row_invariant(run, d, kinds, 2, list(d["write_slots"][2]))


def test_ssd_state_update():
    d = ssu.make_inputs(14, 5, 3, heads=5, head_dim=12, groups=1, state=24)
    kinds = dict.fromkeys((*ssu.ARGS, *ssu.OPTS), OTHER)
    kinds |= dict.fromkeys(("x", "dt", "B", "C", "z", "read_slots", "write_slots"), ROW)
    assert_row_invariant(lambda a: ssu.run(a, "interpret"), d, kinds, 2, list(d["write_slots"][2]))


def test_gdn_state_update():
    names = ("q", "k", "v", "a", "b", "A_log", "dt_bias", "state", "read_slots", "write_slots")
    d = dict(zip(names, gdnu.make_case(5, 3, seed=15, dims=(1, 2, 24, 12)), strict=True))
    kinds = dict.fromkeys(names, ROW) | dict.fromkeys(("A_log", "dt_bias", "state"), OTHER)

    def run(a):
        return ops.gdn_state_update(*(a[n] for n in names), implementation="interpret")

    assert_row_invariant(run, d, kinds, 2, list(d["write_slots"][2]))
