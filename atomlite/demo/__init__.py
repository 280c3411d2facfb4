"""The tiny bundled demo model (model/: a Gemma4ForConditionalGeneration whose small vision tower tells the colour
and the count of shapes in a picture), its speculative-decoding assistant (assistant/) and its tokenizer's builder
(tokenizer.py). The scripts that trained them are outside the package, in tools/demo_training/ of the repository."""
from pathlib import Path

from atomlite.errors import ConfigError

DEMO_DIR = Path(__file__).parent / "model"
DEMO_ASSISTANT_DIR = Path(__file__).parent / "assistant"


def demo_model_dir() -> Path:
    if not (DEMO_DIR / "config.json").exists():
        raise ConfigError(f"the bundled demo model is missing from {DEMO_DIR}: "
                          f"rebuild it from a checkout with `python -m tools.demo_training.train`, or pass --model DIR")
    return DEMO_DIR
