"""The multi-token-prediction (MTP) head of Qwen3-Next and Qwen3.5, built from transformers' own
modules (transformers has no MTP class: its `...ForCausalLM` ignores the `mtp.*` tensors), and the
reference arrays the `*_mtp` fixtures record. See tests/reference/README.md ("MTP fixtures").

The head at position i takes the target's final-normed hidden state h_i and the next token
t_{i+1}:

    x   = fc(concat([pre_fc_norm_embedding(embed(t_{i+1})), pre_fc_norm_hidden(h_i)]))
    m_i = norm(decoder_layer(x))       # one full-attention layer, causal, rotary position i
    logits_i = lm_head(m_i)            # predicts t_{i+2}

`embed` and `lm_head` are the target's. Chained drafting feeds the head its own m back as the
hidden: position n-1 gets (t_n, h_{n-1}) and drafts d_1; position n gets (d_1, m_{n-1}), and so on.
"""

from __future__ import annotations

import copy
import importlib
import json
import re
from pathlib import Path

import numpy as np
import torch
from hf_runs import perturb
from router_margins import MIN_MARGIN, _router_margin
from safetensors.torch import load_file
from torch import nn
from transformers import DynamicCache

CHAIN = 4  # chained drafts recorded after the last real position
INCREMENTAL_TOL = 1e-5


class MTPHead(nn.Module):
    """The `mtp.*` modules, attribute names as the checkpoints store them (under `mtp.`)."""

    def __init__(self, target: nn.Module):
        super().__init__()
        cfg = copy.deepcopy(target.config)
        cfg.num_hidden_layers = 1
        cfg.layer_types = ["full_attention"]  # the layer at index 0 is full attention
        if hasattr(cfg, "mlp_only_layers"):  # Qwen3-Next: the MTP layer is MoE + shared expert
            cfg.mlp_only_layers = []
        cfg._attn_implementation = "eager"  # explicit additive mask below
        self.config = cfg
        text_module = type(target.model.layers[0]).__module__
        module = importlib.import_module(text_module)
        prefix = {"qwen3_next": "Qwen3Next", "qwen3_5_moe": "Qwen3_5Moe"}.get(
            text_module.split(".")[-2], "Qwen3_5"
        )
        norm_cls = getattr(module, f"{prefix}RMSNorm")
        layer_cls = getattr(module, f"{prefix}DecoderLayer")
        hidden = cfg.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = norm_cls(hidden, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = norm_cls(hidden, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList([layer_cls(cfg, 0)])
        self.norm = norm_cls(hidden, eps=cfg.rms_norm_eps)
        # Matrices as the target's _init_weights draws them (normal, initializer_range); norms at
        # their zero init (1 + w). perturb() then moves every one of them.
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, cfg.initializer_range)
                else:
                    p.zero_()

    def forward(
        self,
        target: nn.Module,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: DynamicCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(m, logits) [T, H], [T, V] for T positions fed (tokens [T], hidden [T, H]) at rotary
        positions [T]; with a cache, attends to its keys too (positions continue it)."""
        e = self.pre_fc_norm_embedding(target.model.embed_tokens(tokens))
        g = self.pre_fc_norm_hidden(hidden)
        x = self.fc(torch.cat([e, g], dim=-1))[None]
        pos = positions[None]
        rope = target.model.rotary_emb(x, pos)
        past = 0 if cache is None else cache.get_seq_length()
        total = past + x.shape[1]
        key_pos = torch.arange(total)
        query_pos = torch.arange(past, total)
        mask = torch.zeros(1, 1, x.shape[1], total)
        mask.masked_fill_(key_pos[None, :] > query_pos[:, None], float("-inf"))
        out = self.layers[0](
            x,
            position_embeddings=rope,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=cache,
        )
        m = self.norm(out)[0]
        return m, target.lm_head(m)


def target_hidden(target: nn.Module, seq: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's final-normed hidden states [L, H] and its logits [L, V] (uncached)."""
    ids = torch.from_numpy(seq.astype(np.int64))[None]
    with torch.no_grad():
        h = target.model(ids, use_cache=False).last_hidden_state[0]
        logits = target(ids, use_cache=False).logits[0]
        assert float((target.lm_head(h) - logits).abs().max()) == 0.0
    return h, logits


def run_mtp(head: MTPHead, target: nn.Module, seq: np.ndarray) -> dict[str, np.ndarray]:
    """The recorded arrays: one-shot MTP over positions 0..L-2, then the 4-step chain; asserts that
    the incremental (KV-cached, one position per call) run and a one-shot run over all L+3
    positions give the same logits within INCREMENTAL_TOL."""
    n = len(seq)
    toks = torch.from_numpy(seq.astype(np.int64))
    h, logits = target_hidden(target, seq)
    with torch.no_grad():
        m, mtp_logits = head(target, toks[1:], h[:-1], torch.arange(n - 1))

        # Incremental: one position per call on a KV cache, then the chain on the same cache.
        cache = DynamicCache()
        inc = []
        for i in range(n - 1):
            _, lg = head(target, toks[i + 1 : i + 2], h[i : i + 1], torch.tensor([i]), cache)
            inc.append(lg)
        inc_diff = float((torch.cat(inc) - mtp_logits).abs().max())
        assert inc_diff < INCREMENTAL_TOL, f"incremental vs one-shot MTP logits {inc_diff:.2e}"

        chain_next = int(logits[-1].argmax())
        tok, hid = chain_next, h[-1]
        drafts, chain_logits, chain_toks, chain_hid = [], [], [], []
        for step in range(CHAIN):
            chain_toks.append(tok)
            chain_hid.append(hid)
            m_step, lg = head(
                target, torch.tensor([tok]), hid[None], torch.tensor([n - 1 + step]), cache
            )
            chain_logits.append(lg[0])
            tok, hid = int(lg[0].argmax()), m_step[0]
            drafts.append(tok)

        # The whole thing in one causal forward, chain inputs included.
        all_toks = torch.cat([toks[1:], torch.tensor(chain_toks)])
        all_hid = torch.cat([h, torch.stack(chain_hid[1:])])
        _, all_logits = head(target, all_toks, all_hid, torch.arange(n - 1 + CHAIN))
        chain_logits_t = torch.stack(chain_logits)
        full_diff = float((all_logits - torch.cat([mtp_logits, chain_logits_t])).abs().max())
        assert full_diff < INCREMENTAL_TOL, f"one-shot chain vs incremental {full_diff:.2e}"
    print(f"    mtp incremental-vs-one-shot {inc_diff:.1e}, chain one-shot {full_diff:.1e}")
    return {
        "tokens": seq.astype(np.int32),
        "hidden": h.float().numpy(),
        "mtp_hidden": m.float().numpy(),
        "mtp_logits": mtp_logits.float().numpy(),
        "chain_next": np.asarray(chain_next, dtype=np.int32),
        "chain_drafts": np.asarray(drafts, dtype=np.int32),
        "chain_logits": chain_logits_t.float().numpy(),
    }


def head_margin(head: MTPHead, target: nn.Module, seq: np.ndarray) -> float:
    """Smallest top-k routing gap of the head's MoE router (inf if dense) over the recorded run."""
    routers = [m for m in head.modules() if type(m).__name__.lower().endswith("topkrouter")]
    margins: list[float] = []
    hooks = [
        r.register_forward_hook(lambda mod, _i, out: margins.append(_router_margin(mod, out[0])))
        for r in routers
    ]
    run_mtp(head, target, seq)
    for hk in hooks:
        hk.remove()
    return min(margins, default=float("inf"))


def build_head(target: nn.Module, seq: np.ndarray) -> tuple[MTPHead, float]:
    """The perturbed head: noise seed the first of 101, 102, ... with no router near-tie."""
    for seed in range(101, 121):
        torch.manual_seed(seed)
        head = MTPHead(target).float().eval()
        perturb(head, seed=seed)
        margin = head_margin(head, target, seq)
        if margin > MIN_MARGIN:
            print(f"    mtp noise seed {seed}, route-gap {margin:.1e}")
            return head, margin
    raise AssertionError(f"every MTP seed has a router near-tie (last {margin:.2e})")


def disk_tensors(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """In-memory decoder-layer names to the checkpoints' on-disk names: packed experts split one
    by one (`experts.gate_up_proj` [E, 2I, H] -> `experts.{e}.gate_proj` rows < I, `up_proj` the
    rest; `experts.down_proj` [E, H, I] -> `experts.{e}.down_proj`)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name.endswith("experts.gate_up_proj"):
            base = name.removesuffix("gate_up_proj")
            half = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{prefix}{base}{e}.gate_proj.weight"] = t[e, :half]
                out[f"{prefix}{base}{e}.up_proj.weight"] = t[e, half:]
        elif name.endswith("experts.down_proj"):
            base = name.removesuffix("down_proj")
            for e in range(t.shape[0]):
                out[f"{prefix}{base}{e}.down_proj.weight"] = t[e]
        else:
            out[prefix + name] = t
    return {k: v.detach().float().contiguous().clone() for k, v in out.items()}


def append_tensors(path: Path, new: dict[str, torch.Tensor]) -> None:
    """Append float32 tensors to a safetensors file, keeping the old tensors' bytes and their
    offsets modulo 4096 from the file start: the header is padded with spaces (the format allows
    it). Re-saving with save_file moves them, and a mmapped weight at another alignment can take
    another CPU matmul path (one ulp apart), which would break check_reload's exact comparison."""
    raw = path.read_bytes()
    old_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + old_len])
    data = bytearray(raw[8 + old_len :])
    for name in sorted(new):
        t = new[name]
        assert t.dtype == torch.float32 and t.is_contiguous()
        start = len(data)
        data += t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [start, len(data)]}
    text = json.dumps(header, separators=(",", ":")).encode()
    pad = (old_len - len(text)) % 4096  # 8 + header length stays the same modulo 4096
    text += b" " * pad
    path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(data))


def packed_tensors(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The in-memory names, experts packed (as the published Qwen3.5 MoE checkpoints hold
    them, the head's included)."""
    return {prefix + k: v.detach().float().contiguous().clone() for k, v in state.items()}


def write_mtp(
    head: MTPHead,
    target: nn.Module,
    out_dir: Path,
    count_field: dict[str, object],
    packed: bool = False,
) -> list[str]:
    """Append the head's tensors (as `mtp.*`; experts one by one, or `packed` as the target's
    are) to model.safetensors and `count_field` to config.json; returns the mtp tensor names.
    Checks the expert split against the target's own save_pretrained output first."""
    path = out_dir / "model.safetensors"
    saved = load_file(str(path))
    mine = disk_tensors(target.state_dict(), "")
    for name, t in mine.items():
        if re.search(r"experts\.\d+\.", name) and not packed:
            assert torch.equal(saved[name], t), f"expert split differs from save_pretrained: {name}"
    mtp = (packed_tensors if packed else disk_tensors)(head.state_dict(), "mtp.")
    assert not set(mtp) & set(saved)
    append_tensors(path, mtp)
    assert set(load_file(str(path))) == set(saved) | set(mtp)
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(count_field)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return sorted(mtp)


def check_head_reload(
    target: nn.Module,
    out_dir: Path,
    seq: np.ndarray,
    ref: dict[str, np.ndarray],
    tol: float = 0.0,
) -> None:
    """A head filled from the file's `mtp.*` tensors and a target from `from_pretrained` (which
    must ignore them) reproduce the recorded MTP arrays (exactly, or within the fixture's
    `reload_tol`; tokens and drafts always exactly)."""
    reloaded = type(target).from_pretrained(out_dir).eval()
    fresh = MTPHead(reloaded).float().eval()
    tensors = load_file(str(out_dir / "model.safetensors"))
    on_disk = {k for k in tensors if k.startswith("mtp.")}
    want = disk_tensors(fresh.state_dict(), "mtp.")
    packed_on_disk = on_disk == set(packed_tensors(fresh.state_dict(), "mtp."))
    assert on_disk == set(want) or packed_on_disk
    packed: dict[str, torch.Tensor] = {}
    for name, p in fresh.state_dict().items():
        if packed_on_disk:
            packed[name] = tensors["mtp." + name]
        elif name.endswith("experts.gate_up_proj"):
            base = "mtp." + name.removesuffix("gate_up_proj")
            packed[name] = torch.stack(
                [
                    torch.cat(
                        [
                            tensors[f"{base}{e}.gate_proj.weight"],
                            tensors[f"{base}{e}.up_proj.weight"],
                        ]
                    )
                    for e in range(p.shape[0])
                ]
            )
        elif name.endswith("experts.down_proj"):
            base = "mtp." + name.removesuffix("down_proj")
            packed[name] = torch.stack(
                [tensors[f"{base}{e}.down_proj.weight"] for e in range(p.shape[0])]
            )
        else:
            packed[name] = tensors["mtp." + name]
    fresh.load_state_dict(packed, strict=True)
    got = run_mtp(fresh, reloaded, seq)
    for key, arr in ref.items():
        close = np.allclose(got[key], arr, rtol=0.0, atol=tol) if tol else False
        same = np.array_equal(got[key], arr) or (arr.dtype.kind == "f" and close)
        assert same, f"{out_dir.name}: reloaded MTP differs in {key}"
