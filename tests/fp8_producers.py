"""FP8 checkpoints of tiny random Gemma 4s made by the producing tools themselves, and those tools' own quantized
models as the parity oracle (run in a subprocess: `python this_file OUT_DIR KIND...`).

- compressed-tensors 0.20.1: its presets (FP8_DYNAMIC, FP8_BLOCK, FP8) applied with apply_quantization_config, weight
  scales from the weights' min/max as llm-compressor's default observer computes them, static input scales from
  calibration prompts, compressed with ModelCompressor (float-quantized) and saved as llm-compressor saves.
- Quark 0.13: its gemma4 template's fp8 and ptpc_fp8 schemes, exported with export_safetensors.
MoE experts are split into per-expert Linears first (Quark's preprocess_for_quantization), as both tools' MoE
recipes do; the oracle is the in-memory quantized model (fake-quantized weights and activations, float32).
"""
import json
import sys
from pathlib import Path

import torch

LAYER_TYPES = ["sliding_attention", "full_attention"]
IGNORE = ["lm_head", "re:.*router.*"]
PROMPTS = 6
PROMPT_LEN = 12
NEW_TOKENS = 8


def tiny_model(variant: str, seed: int, **overrides):
    sys.path.insert(0, str(Path(__file__).parent))
    import tiny_models
    from transformers import Gemma4ForCausalLM
    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(tiny_models.text_config(variant, num_hidden_layers=2, layer_types=LAYER_TYPES,
                                                      **overrides))
    tiny_models.randomize(model, seed=seed)
    model = model.float().eval()
    from quark.torch.utils.llm import preprocess_for_quantization
    preprocess_for_quantization(model)  # MoE: fused experts -> one Linear per expert and projection
    return model


def prompts(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 89, (1, PROMPT_LEN), generator=gen) for _ in range(PROMPTS)]


def greedy_sequence(model, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """ids followed by the model's greedy continuation, one full forward per step (no cache: the plainest path)."""
    with torch.no_grad():
        for _ in range(new_tokens):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def save_reference(model, out: Path, seed: int = 100) -> None:
    """Per prompt: the greedy sequence (prompt + NEW_TOKENS) and the oracle's logits at every position of it."""
    sequences = [greedy_sequence(model, p, NEW_TOKENS) for p in prompts(seed)]
    with torch.no_grad():
        logits = [model(s).logits[0] for s in sequences]
    torch.save(dict(sequences=[s[0] for s in sequences], logits=logits, prompt_len=PROMPT_LEN),
               out / "reference.pt")


def _observe_weight(module, args) -> None:
    from compressed_tensors.quantization.utils import calculate_qparams
    w = module.weight.data
    if args.strategy == "tensor":
        lo, hi = w.amin(), w.amax()
    elif args.strategy == "channel":
        lo, hi = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    else:
        bn, bk = args.block_structure
        padded = torch.nn.functional.pad(w, (0, -w.shape[1] % bk, 0, -w.shape[0] % bn))
        blocks = padded.reshape(padded.shape[0] // bn, bn, padded.shape[1] // bk, bk)
        lo, hi = blocks.amin(dim=(1, 3)), blocks.amax(dim=(1, 3))
    scale, _ = calculate_qparams(lo, hi, args)
    module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))


def compressed_tensors_checkpoint(variant: str, scheme: str, out: Path, seed: int, weight_only: bool = False,
                                  **overrides) -> None:
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, QuantizationStatus, apply_quantization_config,
                                                 preset_name_to_scheme)
    model = tiny_model(variant, seed, **overrides)
    qscheme = preset_name_to_scheme(scheme, ["Linear"])
    if weight_only:
        qscheme.input_activations = None
    config = QuantizationConfig(config_groups={"group_0": qscheme}, ignore=IGNORE,
                                quantization_status=QuantizationStatus.FROZEN)
    apply_quantization_config(model, config)
    quantized = [m for m in model.modules() if getattr(m, "quantization_scheme", None) is not None]
    for module in quantized:
        _observe_weight(module, module.quantization_scheme.weights)
        _per_token_on_2d_inputs(module)
    if qscheme.input_activations is not None and not qscheme.input_activations.dynamic:
        _calibrate_inputs(model, quantized, seed)
    save_reference(model, out)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="float-quantized")
    compressor.compress_model(model)
    compressor.remove_decompression_hook(model)
    model.save_pretrained(out)
    compressor.update_config(str(out))


def _per_token_on_2d_inputs(module) -> None:
    """compressed-tensors 0.20.1's dynamic "token" strategy keeps dims 0 and 1 and reduces the rest, so on a 2-D
    input (the MoE experts' [tokens, hidden] rows) it reduces nothing and takes one scale for the whole tensor; the
    checkpoint means one scale per token (as vLLM runs it): such inputs are given as [1, tokens, hidden]."""
    args = module.quantization_scheme.input_activations
    if args is None or args.strategy != "token":
        return
    forward = module.forward
    module.forward = lambda x: forward(x[None])[0] if x.dim() == 2 else forward(x)


def _calibrate_inputs(model, quantized: list, seed: int) -> None:
    """Static input scales: the largest |input| each Linear sees over calibration prompts, / 448 (llm-compressor's
    min-max observer), observed with quantization off."""
    from compressed_tensors.quantization.utils import calculate_qparams
    amax, hooks = {}, []
    for module in quantized:
        module.quantization_enabled = False

        def hook(mod, inputs, _out):
            amax[mod] = torch.maximum(amax.get(mod, torch.zeros(())), inputs[0].detach().abs().amax())
        hooks.append(module.register_forward_hook(hook))
    with torch.no_grad():
        for p in prompts(seed + 7):
            model(p)
    for h in hooks:
        h.remove()
    for module in quantized:
        module.quantization_enabled = True
        scale, _ = calculate_qparams(-amax[module].reshape(1), amax[module].reshape(1),
                                     module.quantization_scheme.input_activations)
        module.input_scale.data.copy_(scale.reshape(module.input_scale.shape))


def quark_checkpoint(variant: str, scheme: str, out: Path, seed: int, weight_only: bool = False,
                     **overrides) -> None:
    from quark.torch import LLMTemplate, ModelQuantizer, export_safetensors
    model = tiny_model(variant, seed, **overrides)
    template = LLMTemplate.get("gemma4")
    config = template.get_config(scheme=scheme, exclude_layers=template.exclude_layers_name)
    if weight_only:
        config.global_quant_config.input_tensors = None
    quantizer = ModelQuantizer(config)
    calibration = torch.utils.data.DataLoader(prompts(seed + 7), batch_size=None)
    qmodel = quantizer.freeze(quantizer.quantize_model(model, calibration))
    if scheme == "ptpc_fp8" and not weight_only:
        _quark_per_token_on_2d_inputs(qmodel)
    save_reference(qmodel, out)
    with torch.no_grad():
        export_safetensors(qmodel, str(out), custom_mode="quark")


def _quark_per_token_on_2d_inputs(qmodel) -> None:
    """Quark 0.13's ptpc_fp8 inputs are per_channel with ch_axis 1: one scale per token of a [batch, tokens, hidden]
    input, but per hidden column of the experts' 2-D [tokens, hidden] rows. The checkpoint means per token (vLLM
    runs it so): the experts' inputs are given as [1, tokens, hidden]."""
    for name, module in qmodel.named_modules():
        if ".experts." in name and name.endswith("_proj"):
            forward = module.forward
            module.forward = lambda x, forward=forward: forward(x[None])[0] if x.dim() == 2 else forward(x)


# name -> (tool, variant, scheme, options)
CHECKPOINTS = {
    "ct_dynamic_dense": ("ct", "dense", "FP8_DYNAMIC", {}),
    "ct_dynamic_moe": ("ct", "moe", "FP8_DYNAMIC", {}),
    # group-128 activations need K in whole groups (compressed-tensors refuses others); k_proj's 64 rows are a
    # partial row block, and q, k and v straddle blocks in atomlite's fused qkv
    "ct_block_dense": ("ct", "dense", "FP8_BLOCK", dict(hidden_size=128, intermediate_size=256)),
    "ct_block_moe": ("ct", "moe", "FP8_BLOCK", dict(hidden_size=128, intermediate_size=256,
                                                    moe_intermediate_size=128)),
    "ct_static_dense": ("ct", "dense", "FP8", {}),
    "ct_w8a16_dense": ("ct", "dense", "FP8_DYNAMIC", dict(weight_only=True)),
    # weight-only blocks: partial K blocks too (hidden 64, down_proj's K 88)
    "ct_w8a16_moe": ("ct", "moe", "FP8_BLOCK", dict(weight_only=True, moe_intermediate_size=88)),
    "quark_fp8_dense": ("quark", "dense", "fp8", {}),
    "quark_fp8_moe": ("quark", "moe", "fp8", {}),
    "quark_ptpc_dense": ("quark", "dense", "ptpc_fp8", {}),
    "quark_ptpc_moe": ("quark", "moe", "ptpc_fp8", {}),
    "quark_w8a16_dense": ("quark", "dense", "ptpc_fp8", dict(weight_only=True)),
}


def make(name: str, root: Path, seed: int = 0) -> Path:
    tool, variant, scheme, options = CHECKPOINTS[name]
    out = root / name
    out.mkdir(parents=True, exist_ok=True)
    produce = compressed_tensors_checkpoint if tool == "ct" else quark_checkpoint
    produce(variant, scheme, out, seed, **options)
    return out


if __name__ == "__main__":
    root = Path(sys.argv[1])
    for checkpoint in sys.argv[2:]:
        make(checkpoint, root)
        print(checkpoint, json.dumps(json.loads((root / checkpoint / "config.json").read_text())
                                     .get("quantization_config"))[:200])
