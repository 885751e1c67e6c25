"""What a request gives back beyond its token ids, decided on the host after each step.

`request_output.py`: `RequestOutput` (a finished request) and `StreamDelta` (what one step added
to one request); `processor.py`: log-probabilities, text and stop strings, stream deltas, done only
for steps that need them; `detokenizer.py`: incremental text that never splits a character.
"""
