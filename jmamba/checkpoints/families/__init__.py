"""One `config.json` adapter per architecture, and the registry that picks one (`registry`)."""
