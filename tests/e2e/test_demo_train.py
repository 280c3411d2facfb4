"""The demo model's training recipe (tools/demo_training/train.py): its data, and what it saves. Nothing here trains."""
import json

import torch
from safetensors import safe_open
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

from atomlite import LLM, SamplingParams
from atomlite.accuracy.catalog import REPO_CI
from atomlite.demo.tokenizer import build_char_tokenizer
from tools.demo_training.data import write_eval_files
from tools.demo_training.train import (CONFIG, MAX_WEIGHT_BYTES, TrainingBatches, char_ids, encode, encode_piece, save,
                                       storage_dtype, training_batch)


def test_eval_files_are_what_the_generator_writes(tmp_path):
    """The training mix may change; the evaluation files (and so the recorded baselines) must not."""
    write_eval_files(tmp_path)
    for split in (REPO_CI / "data").glob("*.jsonl"):
        assert (tmp_path / split.name).read_text() == split.read_text(), split.name


def test_char_table_encodes_like_the_tokenizer():
    tokenizer = build_char_tokenizer()
    table = char_ids(tokenizer)
    ids, _ = training_batch(table, seed=0, step=3, batch_size=2, seq_len=256)
    text = tokenizer.decode(ids.flatten().tolist())
    assert encode(table, text) == tokenizer.encode(text, add_special_tokens=False) == ids.flatten().tolist()


def test_chat_episodes_are_what_the_chat_template_renders_and_end_turns_with_an_eos_token():
    import random

    from tools.demo_training.data import chat_episode
    tokenizer = build_char_tokenizer()
    table = char_ids(tokenizer)
    rng = random.Random(5)
    for _ in range(20):
        pieces = [text for text, _ in chat_episode(rng)]
        turns = [pieces[i:i + 9] for i in range(1, len(pieces), 9)]  # <start_of_turn> user ... <end_of_turn> \n
        messages = []
        for turn in turns:
            messages += [{"role": "user", "content": turn[1].removeprefix("user\n")},
                         {"role": "assistant", "content": turn[6]}]
        text = "".join(pieces)
        assert text == tokenizer.apply_chat_template(messages, tokenize=False)
        ids = [i for piece in pieces for i in encode_piece(table, piece)]
        assert ids == tokenizer.encode(text, add_special_tokens=False)
    end_of_turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert end_of_turn in CONFIG["eos_token_id"]


def test_batches_are_the_same_for_any_number_of_data_workers():
    dataset = TrainingBatches(char_ids(build_char_tokenizer()), seed=0, steps=5, batch_size=2, seq_len=64)
    alone = list(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=0))
    shared = list(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2))
    assert len(alone) == len(shared) == 5
    for (ids, weights), (ids2, weights2) in zip(alone, shared):
        assert torch.equal(ids, ids2) and torch.equal(weights, weights2)
    assert not torch.equal(alone[0][0], alone[1][0])


def test_saved_recipe_model_fits_the_size_limit_and_serves_in_float32(tmp_path):
    torch.manual_seed(0)
    model = Gemma4ForCausalLM(Gemma4TextConfig(**CONFIG)).float()
    dtype = storage_dtype(model)
    save(model, build_char_tokenizer(), tmp_path, dtype)
    assert (tmp_path / "model.safetensors").stat().st_size <= MAX_WEIGHT_BYTES
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "float32"
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert {f.get_tensor(name).dtype for name in f.keys()} == {dtype}
    llm = LLM(model=str(tmp_path), max_model_len=256)
    assert llm.engine.config.torch_dtype == torch.float32
    out = llm.generate(["Question: 1 + 1?\nAnswer:"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
