"""The tiny bundled demo model (model/) and the tools that make it (data.py, train.py, tokenizer.py)."""
from pathlib import Path

from atomlite.errors import ConfigError

DEMO_DIR = Path(__file__).parent / "model"


def demo_model_dir() -> Path:
    if not (DEMO_DIR / "config.json").exists():
        raise ConfigError(f"the bundled demo model is missing from {DEMO_DIR}: "
                          f"rebuild it with `python -m atomlite.demo.train`, or pass --model DIR")
    return DEMO_DIR
