"""The input side of images and video frames: media fetching under the operator's policy, Gemma 4's
processor (placeholders expanded, pixels patched and hashed), and the settings that bound them."""
from atomlite.multimodal.inputs import ImageItem, MultiModalPrompt

__all__ = ["ImageItem", "MultiModalPrompt"]
