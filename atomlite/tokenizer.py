from pathlib import Path


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def has_tokenizer(model_dir: Path) -> bool:
    return any((Path(model_dir) / f).exists() for f in TOKENIZER_FILES)


def require_tokenizer(model_dir: Path) -> None:
    """Text prompts need a tokenizer: say so before anything is built."""
    from atomlite.errors import ConfigError
    if not has_tokenizer(model_dir):
        raise ConfigError(f"{model_dir} has no tokenizer ({', '.join(TOKENIZER_FILES)}), so text prompts cannot "
                          f"be encoded: add the checkpoint's tokenizer files")


def load_tokenizer(model_dir: Path):
    """The checkpoint's tokenizer, or None when the folder has none (token-id prompts still work)."""
    if not has_tokenizer(model_dir):
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model_dir)
