"""The token mixers, each with its cache: `attention` (`KVCache`), `mamba2` (`Mamba2State`),
`gated_deltanet` (`GDNState`), `parallel_hybrid` (attention and Mamba2 side by side) and
`transformer_mamba2` (Zamba2's shared block feeding Mamba2); with what they share, the views of
the step's token layout (`token_layout`) and the recurrent mixers' kernel rows and boundary conv
windows (`boundary_states`)."""
