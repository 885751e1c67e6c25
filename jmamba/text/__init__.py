"""Text: the presets' byte-level tokenizer (`tokenizer`) and checkpoints' chat templates
(`chat_template`)."""
