"""Reading a Hugging Face `config.json`: required fields, encoded floats, EOS ids, bias flags, and
the `ModelConfig` fields every architecture shares. The adapters
(`jmamba.checkpoints.families.registry`, `jmamba.checkpoints.families.ibm`) build on these."""

from __future__ import annotations

from typing import Any

from jmamba.config import Ffn, Mixer, ModelConfig

HFConfig = dict[str, Any]


def _get(cfg: HFConfig, key: str, default: Any = ...) -> Any:
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is ...:
        arch = cfg.get("architectures", ["?"])[0]
        # A multimodal wrapper's fields are read from its text_config (families.text_config).
        where = "the text_config of " if arch.endswith("ForConditionalGeneration") else ""
        raise ValueError(f"{where}config.json of {arch} is missing the required field {key!r}")
    return default


def _decode_float(value: Any) -> float:
    """config.json stores infinity as {"__float__": "Infinity"} (transformers 5.x)."""
    if isinstance(value, dict) and "__float__" in value:
        return float(value["__float__"])
    return float(value)


def _eos_ids(cfg: HFConfig, source: str = "config.json") -> tuple[int, ...]:
    """`eos_token_id` (an int, a list of ints or absent) as a tuple of ids."""
    eos = cfg.get("eos_token_id")
    ids = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise ValueError(f"eos_token_id={eos!r} in {source} must be an int id or a list of them")
    return tuple(ids)


def _common(cfg: HFConfig, mixers: list[Mixer], ffns: list[Ffn], **kwargs: Any) -> ModelConfig:
    kwargs = {**_mtp_pattern(cfg, mixers, ffns), **kwargs}
    return ModelConfig(
        architecture=cfg["architectures"][0],
        vocab_size=int(_get(cfg, "vocab_size")),
        hidden_size=int(_get(cfg, "hidden_size")),
        mixers=tuple(mixers),
        ffns=tuple(ffns),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        eos_token_ids=_eos_ids(cfg),
        **kwargs,
    )


def _check_no_bias(cfg: HFConfig, *keys: str) -> None:
    for key in keys:
        if cfg.get(key):
            raise ValueError(f"{key}=True is not supported")


def _rope(cfg: HFConfig, head_dim: int) -> tuple[int, float]:
    """(rotary_dim, rope_theta) from 5.x `rope_parameters` or the older top-level fields."""
    params = cfg.get("rope_parameters") or {}
    theta = _decode_float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    factor = _decode_float(
        params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    )
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"rope_type={rope_type!r} is not supported (only 'default')")
    return int(head_dim * factor), theta


# The multi-token-prediction head's layer count (`jmamba.mtp`): Qwen3-Next and NemotronH name it
# `num_nextn_predict_layers`, Qwen3.5 `mtp_num_hidden_layers`.
_MTP_COUNTS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
# NemotronH's MTP blocks (`mtp_hybrid_override_pattern` characters, `mtp_layers_block_type` names)
_NEMOTRON_MTP = {
    "*": (Mixer.ATTENTION, Ffn.NONE),
    "E": (Mixer.NONE, Ffn.MOE),
    "-": (Mixer.NONE, Ffn.MLP),
}
_NEMOTRON_MTP_NAMES = {"attention": "*", "full_attention": "*", "moe": "E", "mlp": "-"}


def _mtp_pattern(cfg: HFConfig, mixers: list[Mixer], ffns: list[Ffn]) -> dict[str, Any]:
    """`mtp_mixers` / `mtp_ffns` of the config's MTP head (none without an MTP count): NemotronH's
    blocks from its MTP pattern (one MTP layer); else each MTP layer a full-attention layer whose
    FFN is that of the model's attention layers (Qwen3-Next, Qwen3.5)."""
    count = next((int(cfg[k]) for k in _MTP_COUNTS if cfg.get(k)), 0)
    if count == 0:
        return {}
    names = cfg.get("mtp_layers_block_type")
    pattern = cfg.get("mtp_hybrid_override_pattern") or (
        "".join(_NEMOTRON_MTP_NAMES[n] for n in names) if names else None
    )
    if pattern is not None:
        if count != 1:
            raise ValueError(f"num_nextn_predict_layers={count}: NemotronH's MTP head has 1 layer")
        blocks = [_NEMOTRON_MTP[c] for c in pattern]
    elif Mixer.ATTENTION in mixers:
        blocks = [(Mixer.ATTENTION, ffns[mixers.index(Mixer.ATTENTION)])] * count
    else:
        raise ValueError(f"an MTP head of {count} layers needs an attention layer to copy")
    return dict(mtp_mixers=tuple(m for m, _ in blocks), mtp_ffns=tuple(f for _, f in blocks))
