class ConfigError(ValueError):
    """A checkpoint or setting that atomlite cannot use; the message says what to change."""
