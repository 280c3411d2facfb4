"""A tiny Gemma 4 "vision" checkpoint for the input side: the demo's text model with Gemma 4's vision special tokens
in its tokenizer, a chat template that renders image and video parts as Gemma 4's does (one <|image|> or
<|video|> per part), and a config.json that declares a vision tower and its token ids; plus transformers'
Gemma4Processor over the same tokenizer (its image path: the PIL image processor), the reference."""
import io
import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.torch import load_file, save_file

from atomlite.demo import demo_model_dir

VISION_TOKENS = ["<|image>", "<|image|>", "<image|>", "<|video|>", "<|audio|>", "<|audio>", "<audio|>"]
TOKEN_ROLES = {"boi_token": "<|image>", "image_token": "<|image|>", "eoi_token": "<image|>",
               "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}
# Gemma 4's way with content parts: text trimmed, one placeholder per image or video part, in place
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for part in m['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] | trim }}{% elif part['type'] == 'image' %}<|image|>"
    "{% elif part['type'] == 'video' %}<|video|>{% endif %}{% endfor %}{% endif %}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>assistant\n{% endif %}")
VISION_CONFIG = {"model_type": "gemma4_vision", "patch_size": 16, "pooling_kernel_size": 3,
                 "default_output_length": 280}


def text_only_model_dir(out: Path) -> Path:
    """The demo's text model alone (its weights too, so an engine runs it): a Gemma4ForCausalLM folder, no tower."""
    out.mkdir(parents=True, exist_ok=True)
    for f in demo_model_dir().iterdir():
        if f.is_file() and f.name not in ("model.safetensors", "config.json", "processor_config.json"):
            shutil.copy(f, out / f.name)
    demo = json.loads((demo_model_dir() / "config.json").read_text())
    config = {**demo["text_config"], "architectures": ["Gemma4ForCausalLM"], "dtype": demo.get("dtype", "float32")}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    tensors = load_file(demo_model_dir() / "model.safetensors")
    save_file({name.replace("model.language_model.", "model.", 1): t for name, t in tensors.items()
               if name.startswith("model.language_model.")}, out / "model.safetensors", metadata={"format": "pt"})
    return out


def vision_model_dir(out: Path) -> Path:
    """The demo's text model as a folder that declares a vision tower but carries none: the input side's
    checkpoint, at Gemma 4's default processor settings (280 soft tokens)."""
    text_only_model_dir(out)
    ids = _with_vision_tokens(out)
    config = json.loads((out / "config.json").read_text())
    config.update(vision_config=VISION_CONFIG, image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
                  boi_token_id=ids["<|image>"], eoi_token_id=ids["<image|>"])
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def _with_vision_tokens(out: Path) -> dict[str, int]:
    """Gemma 4's vision tokens added to the tokenizer in out, with CHAT_TEMPLATE; their ids."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.save_pretrained(out)
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    tokenizer_config["extra_special_tokens"] = TOKEN_ROLES
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return dict(zip(VISION_TOKENS, tokenizer.convert_tokens_to_ids(VISION_TOKENS)))


def tiny_vision_model_dir(out: Path, tower: str = "clipped"):
    """A tiny random Gemma4ForConditionalGeneration with a real vision tower (tiny_models' shape `tower`,
    bidirectional image attention) behind the demo's char tokenizer with Gemma 4's vision tokens: images served end
    to end. -> (folder, the float32 transformers model)."""
    import tiny_models
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4VisionConfig
    from atomlite.demo.tokenizer import save_char_tokenizer
    out.mkdir(parents=True, exist_ok=True)
    save_char_tokenizer(out)
    ids = _with_vision_tokens(out)
    text = tiny_models.text_config("dense", vocab_size=128, max_position_embeddings=1024,
                                   use_bidirectional_attention="vision")
    config = Gemma4Config(text_config=text.to_dict(), vision_config=Gemma4VisionConfig(**tiny_models.VISION[tower]),
                          image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
                          boi_token_id=ids["<|image>"], eoi_token_id=ids["<image|>"],
                          audio_token_id=ids["<|audio|>"], boa_token_id=ids["<|audio>"],
                          eoa_token_index=ids["<audio|>"])
    model = Gemma4ForConditionalGeneration(config)
    tiny_models.randomize(model, 0)
    model = model.float().eval()
    model.save_pretrained(out)
    return out, model


def reference_processor(model_dir: Path):
    """transformers' Gemma4Processor with its PIL image processor. Its video processor needs torchvision, which
    does not import here; so this processor takes images only (a video argument would fail)."""
    from transformers import AutoTokenizer, Gemma4Processor
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    class ImageOnlyGemma4Processor(Gemma4Processor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name != "video_processor":
                return super().check_argument_for_proper_class(argument_name, argument)

    return ImageOnlyGemma4Processor(Gemma4AudioFeatureExtractor(), Gemma4ImageProcessorPil(),
                                    AutoTokenizer.from_pretrained(model_dir), None)


def video_bytes(frames: int = 45, fps: int = 10, codec: str = "mpeg4") -> bytes:
    """Gray frames, frame i painted i * 5. mpeg4 in mp4 states its frame count; lossless ffv1 in matroska not."""
    import av
    out = io.BytesIO()
    with av.open(out, "w", format="mp4" if codec == "mpeg4" else "matroska") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = 64, 48
        stream.pix_fmt = "yuv420p" if codec == "mpeg4" else "yuv444p"
        if codec == "mpeg4":
            stream.bit_rate, stream.options = 20_000_000, {"qscale": "1"}
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), i * 5, np.uint8), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return out.getvalue()
