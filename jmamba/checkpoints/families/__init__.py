"""One `config.json` adapter module per family (`mamba2`: Mamba2 and NemotronH; `qwen`;
`falcon_h1`; `ibm`: Bamba and Granite-4.0-H; `zamba2`), the field readers they share
(`hf_fields`), and the registry that picks one by architecture (`registry`)."""
