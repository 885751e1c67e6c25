"""Causal depthwise conv1d: y_t = act(bias + sum_j w_j x_{t - W + 1 + j}) per channel, the window
of the last W - 1 inputs kept as a slot-indexed conv state.

`reference.py` holds the plain-jnp definitions (ragged prefill, 1 + K-lane decode update) and the
input checks the kernels share, and `causal_conv1d_boundary_states` (prefix caching's windows at
state-block boundaries), which has no kernel. `prefill.py` is the prefill op
`causal_conv1d_prefill`, launching the walk and final-window kernels of `prefill_kernels.py`;
`update.py` is the decode op `causal_conv1d_update`; `window.py` holds the window loads, stores
and tap sum every conv kernel shares.
"""
