"""The demo's vision recipe (tools/demo_training/train_vision.py): its chats are what the chat template and the
processor render, a short CPU run saves a folder atomlite serves, and the shipped demo answers pictures through atomlite
token for token as transformers' own model does."""
import json
import random
import subprocess
import sys
from pathlib import Path

import torch

from atomlite import LLM, SamplingParams
from atomlite.accuracy.vqa_pictures import eval_items
from atomlite.demo import demo_model_dir
from atomlite.demo.tokenizer import build_char_tokenizer
from atomlite.multimodal.patches import PatchSpec
from atomlite.multimodal.processor import MultiModalProcessor
from atomlite.tokenizer import load_tokenizer
from tools.demo_training.train import char_ids
from tools.demo_training.train_vision import MAX_SOFT_TOKENS, chat_example, drawn_chat, token_ids


def test_training_chats_are_what_the_template_and_the_processor_render():
    tokenizer = build_char_tokenizer()
    processor = MultiModalProcessor.from_model_dir(demo_model_dir(), load_tokenizer(demo_model_dir()))
    rng, orders = random.Random(3), set()
    for _ in range(8):
        chat = drawn_chat(rng)
        picture, question, answer, picture_first = chat
        ids, weights, item = chat_example(char_ids(tokenizer), token_ids(tokenizer), chat,
                                          PatchSpec(max_soft_tokens=MAX_SOFT_TOKENS))
        parts = [{"type": "image"}, {"type": "text", "text": question}]
        text = tokenizer.apply_chat_template([{"role": "user", "content": parts if picture_first else parts[::-1]}],
                                             tokenize=False, add_generation_prompt=True)
        rendered = processor.process(text + answer + "<end_of_turn>", [picture.image], add_special_tokens=False)
        assert rendered.prompt_token_ids == ids
        assert torch.equal(rendered.items[0].pixel_values, item.pixel_values)
        reply = [i for i, w in enumerate(weights) if w]
        assert tokenizer.decode([ids[i] for i in reply]) == answer + "<end_of_turn>"
        orders.add(picture_first)
    assert orders == {True, False}


def test_the_demo_is_a_vision_model_with_small_images():
    config = json.loads((demo_model_dir() / "config.json").read_text())
    processor = json.loads((demo_model_dir() / "processor_config.json").read_text())
    assert config["architectures"] == ["Gemma4ForConditionalGeneration"]
    assert config["text_config"]["use_bidirectional_attention"] == "vision"
    assert processor["image_processor"]["max_soft_tokens"] == config["vision_config"]["default_output_length"] == 70
    tokenizer = load_tokenizer(demo_model_dir())
    for role in ("boi", "image", "eoi", "video"):
        assert 101 <= config[f"{role}_token_id"] < config["text_config"]["vocab_size"]
        assert tokenizer.convert_ids_to_tokens(config[f"{role}_token_id"]) in ("<|image>", "<|image|>", "<image|>",
                                                                               "<|video|>")


def test_a_short_cpu_run_saves_a_folder_atomlite_serves(tmp_path):
    run = subprocess.run([sys.executable, "-m", "tools.demo_training.train_vision", "--device", "cpu", "--steps", "2",
                          "--batch-size", "2", "--text-batch", "1", "--seq-len", "64", "--probe-every", "0",
                          "--threads", "1", "--out", str(tmp_path)], capture_output=True, text=True, timeout=900,
                         cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "vqa probe" in run.stdout and (tmp_path / "processor_config.json").exists()
    llm = LLM(str(tmp_path), device="cpu", max_model_len=512)
    picture, question, _ = eval_items(1)[0]
    out = llm.generate({"prompt": f"<|image|>{question}", "multi_modal_data": {"image": picture.image}},
                       SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3


def test_the_demo_answers_pictures_as_transformers_does():
    from transformers import Gemma4ForConditionalGeneration
    reference = Gemma4ForConditionalGeneration.from_pretrained(demo_model_dir(), dtype=torch.float32).eval()
    llm = LLM(str(demo_model_dir()), device="cpu", max_model_len=512)
    processor = llm._multimodal
    for picture, question, _ in eval_items(4, seed=77):
        prompt = {"prompt": f"<bos><start_of_turn>user\n<|image|>{question}<end_of_turn>\n<start_of_turn>assistant\n",
                  "multi_modal_data": {"image": picture.image}}
        ours = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0))[0].outputs[0].token_ids
        _, processed = processor.prompt_dict(prompt)
        ids = torch.tensor([processed.prompt_token_ids])
        item = processed.items[0]
        image_id = reference.config.image_token_id
        with torch.no_grad():
            theirs = reference.generate(input_ids=ids, pixel_values=item.pixel_values[None],
                                        image_position_ids=item.image_position_ids[None],
                                        mm_token_type_ids=(ids == image_id).long(), max_new_tokens=12,
                                        do_sample=False)[0, ids.shape[1]:].tolist()
        assert list(ours) == theirs[:len(ours)], (question, ours, theirs)
