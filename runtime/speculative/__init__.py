"""Speculative decoding: drafters propose tokens past a request's last one, the target model
verifies them all in one step, and the accepted ones are kept (greedy output is unchanged).

- `drafter.py`: the contract every drafter keeps, `NoDrafts` (speculation off) and the factory;
- `ngram.py`: prompt lookup in the request's own tokens, on the host;
- `draft_model.py` (+ `draft_sequences.py`): a smaller model over the target's vocabulary, with its
  own caches, rolled back by slot choice like the target;
- `mtp.py`: the model's own multi-token-prediction head drafts on the device, inside the step
  (`runtime.device.mtp_drafts`), and hands its drafts to the next step;
- `gate.py`: whether a step drafts at all (`BatchLimit`, the adaptive gate);
- `verify.py`: which drafts a step accepted, and the acceptance counters.

`drafter.make_drafter` builds the drafter a config asks for; the engine always holds one.
"""
