from pathlib import Path


def load_tokenizer(model_dir: Path):
    """The checkpoint's tokenizer, or None when the folder has none (token-id prompts still work)."""
    if not any((model_dir / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model_dir)
