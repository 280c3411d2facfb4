"""atomlite's MXFP4 path against amd-quark 0.13 itself: its quantizer functions, and a tiny random Gemma 4 that it
quantizes and exports. Quark runs once per session in a subprocess (run as a script: `python this_file OUT_DIR`),
which keeps its heavy import and its patches out of the test process."""
import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch

LAYER_TYPES = ["sliding_attention", "full_attention"]
EXTRA_EXCLUDE = "*layers.1.mlp.*"
WEIGHT_ONLY_PATTERN = "*v_proj"
PARTIAL_BLOCK_INTERMEDIATE = 24


def quantize_with_quark(variant: str, seed: int, kv_cache: bool = False, **overrides):
    """A tiny random Gemma 4 quantized by Quark's gemma4 MXFP4 template, as Quark's LLM PTQ tool does it:
    preprocess_for_quantization first (it splits fused MoE experts into per-expert Linears). kv_cache: with an fp8
    KV cache whose scales are observed on the cached values (kv_cache_post_rope)."""
    sys.path.insert(0, str(Path(__file__).parents[1]))
    import tiny_models
    from quark.torch import LLMTemplate, ModelQuantizer
    from quark.torch.utils.llm import preprocess_for_quantization
    from transformers import Gemma4ForCausalLM

    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(tiny_models.text_config(variant, num_hidden_layers=2, layer_types=LAYER_TYPES,
                                                      **overrides))
    tiny_models.randomize(model, seed=seed)
    model = model.float().eval()
    preprocess_for_quantization(model)
    template = LLMTemplate.get("gemma4")
    kv = {}
    if kv_cache:
        allow_cache_update_kwargs()
        template.kv_layers_name = ["*k_proj", "*v_proj"]  # the template's own match multimodal names only
        kv = dict(kv_cache_scheme="fp8")
    config = template.get_config(scheme="mxfp4", exclude_layers=template.exclude_layers_name + [EXTRA_EXCLUDE],
                                 layer_config={WEIGHT_ONLY_PATTERN: "mxfp4_weight_only"}, **kv)
    config.kv_cache_post_rope = kv_cache
    calibration = [torch.randint(3, 96, (1, 16), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    quantizer = ModelQuantizer(config)
    return quantizer.freeze(quantizer.quantize_model(model, torch.utils.data.DataLoader(calibration,
                                                                                        batch_size=None)))


def allow_cache_update_kwargs() -> None:
    """transformers 5's Gemma 4 calls cache.update(..., kwargs=...), which Quark 0.13's post-RoPE cache rejects (a
    TypeError during calibration): its update is given a signature that takes and drops the extra keyword."""
    from quark.torch.quantization import cache_integration
    update = cache_integration.QuarkQuantizedCache.update
    cache_integration.QuarkQuantizedCache.update = lambda self, k, v, layer, cache_kwargs=None, **_: update(
        self, k, v, layer, cache_kwargs)


def make_reference(out: Path) -> None:
    """Quantize tiny dense and MoE Gemma 4s with Quark; save their exports, their in-memory outputs and Quark's
    format functions' results."""
    from quark.torch import export_safetensors
    from quark.torch.quantization.config.config import OCP_MXFP4Spec
    from quark.torch.quantization.tensor_quantize import FakeQuantizeBase
    from quark.torch.utils.numerics import to_e8m0_uint8
    from quark.torch.utils.pack import create_pack_method

    # and experts whose down_proj K (24) is a partial 32-block, which Quark pads
    for name, overrides in (("moe", {}), ("moe24", dict(moe_intermediate_size=PARTIAL_BLOCK_INTERMEDIATE))):
        qmoe = quantize_with_quark("moe", seed=3, **overrides)
        gen = torch.Generator().manual_seed(2)
        with torch.no_grad():
            moe_ids = torch.randint(3, 96, (1, 12), generator=gen)
            torch.save(dict(ids=moe_ids, logits=qmoe(moe_ids).logits), out / f"quark_{name}_reference.pt")
            export_safetensors(qmoe, str(out / f"{name}_checkpoint"), custom_mode="quark")

    # K and V cached on every layer (no k_eq_v: there Quark would quantize K and keep V float, where atomlite caches
    # V alone), so Quark's model and atomlite's cache quantize the same tensors
    qkv = quantize_with_quark("dense", seed=4, kv_cache=True, attention_k_eq_v=False)
    with torch.no_grad():
        kv_ids = torch.randint(3, 96, (1, 12), generator=torch.Generator().manual_seed(5))
        torch.save(dict(ids=kv_ids, logits=qkv(kv_ids).logits), out / "quark_kv_reference.pt")
        export_safetensors(qkv, str(out / "kv_checkpoint"), custom_mode="quark")

    qmodel = quantize_with_quark("dense", seed=0)
    gen = torch.Generator().manual_seed(1)
    linears = {}
    with torch.no_grad():
        for name, module in qmodel.named_modules():
            if isinstance(module, torch.nn.Linear):
                x = torch.randn(5, module.in_features, generator=gen) * torch.logspace(-2, 2, 5)[:, None]
                linears[name] = (type(module).__name__, x, module(x))
        ids = torch.randint(3, 96, (1, 12), generator=gen)
        logits = qmodel(ids).logits

    x = torch.randn(64, 256, generator=gen) * torch.logspace(-4, 4, 64)[:, None]
    x[0, :32], x[1, 32:64] = 0.0, -1e-3 * x[1, 32:64].abs()
    fake_quantize = FakeQuantizeBase.get_fake_quantize(OCP_MXFP4Spec(ch_axis=-1, is_dynamic=False)
                                                       .to_quantization_spec())
    qdq = fake_quantize(x)
    scale = fake_quantize.scale
    pack = create_pack_method("per_group", "fp4")
    elements = (qdq.reshape(64, 8, 32) / scale.reshape(64, 8, 1)).reshape(64, 256)
    all_bytes = torch.arange(256, dtype=torch.uint8).reshape(8, 32)
    torch.save(dict(linears=linears, ids=ids, logits=logits, x=x, qdq=qdq, scale=to_e8m0_uint8(scale),
                    packed=pack.pack(elements, True), all_bytes=all_bytes,
                    all_bytes_unpacked=pack.unpack(all_bytes, True)), out / "quark_reference.pt")
    with torch.no_grad():
        export_safetensors(qmodel, str(out / "checkpoint"), custom_mode="quark")


@pytest.fixture(scope="session")
def quark_run(tmp_path_factory):
    if find_spec("quark") is None:
        pytest.skip("amd-quark is not installed (pip install atomlite[quark])")
    out = tmp_path_factory.mktemp("quark")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, __file__, str(out)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    from safetensors.torch import load_file
    checkpoint = out / "checkpoint"
    return dict(reference=torch.load(out / "quark_reference.pt"), dir=checkpoint,
                tensors=load_file(checkpoint / "model.safetensors"),
                config=json.loads((checkpoint / "config.json").read_text()),
                moe_reference=torch.load(out / "quark_moe_reference.pt"), moe_dir=out / "moe_checkpoint",
                moe24_reference=torch.load(out / "quark_moe24_reference.pt"), moe24_dir=out / "moe24_checkpoint",
                kv_reference=torch.load(out / "quark_kv_reference.pt"), kv_dir=out / "kv_checkpoint")


def test_random_tensors_quantize_like_quark(quark_run):
    from atomlite.quant import mxfp4
    ref = quark_run["reference"]
    packed, scale = mxfp4.quantize(ref["x"])
    assert torch.equal(scale, ref["scale"])
    assert torch.equal(packed, ref["packed"])
    assert torch.equal(mxfp4.quantize_dequantize(ref["x"]), ref["qdq"])
    nonzero = ref["scale"] > 1  # Quark stores byte 1 for all-zero blocks but quantized them with 2^-127
    roundtrip = mxfp4.dequantize(packed, scale).reshape(64, 8, 32)[nonzero]
    assert torch.equal(roundtrip, ref["qdq"].reshape(64, 8, 32)[nonzero])
    assert torch.equal(mxfp4.e2m1_decode(mxfp4.unpack_e2m1(ref["all_bytes"])), ref["all_bytes_unpacked"])


def test_export_has_packed_weights_and_keeps_excluded_layers_float(quark_run):
    """Every exported weight is uint8 [N, K/2] + [N, K/32]; excluded layers keep a float weight and no scale."""
    tensors = quark_run["tensors"]
    scales = [name for name in tensors if name.endswith(".weight_scale")]
    # layer 0: q k v o gate up down; layer 1 (full attention, k_eq_v: no v_proj; mlp excluded): q k o
    assert len(scales) == 7 + 3
    for name in scales:
        weight = tensors[name.removesuffix("_scale")]
        assert weight.dtype == torch.uint8 and tensors[name].shape == (weight.shape[0], weight.shape[1] // 16)
    for leaf in ("gate_proj", "up_proj", "down_proj"):
        assert tensors[f"model.layers.1.mlp.{leaf}.weight"].is_floating_point()
        assert f"model.layers.1.mlp.{leaf}.weight_scale" not in tensors


def test_exported_config_gives_each_layer_its_spec(quark_run):
    from atomlite.quant.quark import QuarkConfig
    config = QuarkConfig.from_hf_config(quark_run["config"])
    for name, (kind, _, _) in quark_run["reference"]["linears"].items():
        spec = config.spec_for(name)
        assert (spec is not None) == (kind == "QuantLinear"), name
        if spec is not None:
            assert spec.dynamic_fp4_input == (not name.endswith("v_proj")), name
    assert config.spec_for("model.layers.0.mlp.gate_up_proj").dynamic_fp4_input
    assert config.spec_for("model.layers.1.mlp.gate_up_proj") is None


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_mxfp4_linear_matches_quark_quantized_module(quark_run, backend):
    from atomlite.model_ops import dispatch
    from atomlite.model_ops.mxfp4_linear import MXFP4Linear
    from atomlite.model_ops.platform import detect_platform
    from atomlite.quant.quark import QuarkConfig
    config = QuarkConfig.from_hf_config(quark_run["config"])
    tensors = quark_run["tensors"]
    checked = 0
    for name, (kind, x, expected) in quark_run["reference"]["linears"].items():
        spec = config.spec_for(name)
        if spec is None:
            continue
        with dispatch.use(detect_platform(torch.device("cpu")), backend):
            layer = MXFP4Linear(x.shape[1], expected.shape[1], spec)
        for param_name, param in layer.named_parameters():
            param.weight_loader(param, tensors[f"{name}.{param_name}"])
        layer.process_after_loading()
        got = layer(x)
        # fp32: only the summation order differs from Quark's dequantize-then-F.linear.
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item(), msg=name)
        checked += 1
    assert checked == 10


@pytest.mark.parametrize("kernel_backend", ["torch", "triton"])
def test_whole_model_matches_quarks_quantized_model(quark_run, kernel_backend):
    """atomlite loads Quark's export (MXFP4 layers, an excluded float MLP, weight-only v_proj) and scores every
    position of a prompt like Quark's own in-memory quantized model; greedy next tokens agree everywhere."""
    from atomlite import LLM
    assert_scores_like_quark(LLM(str(quark_run["dir"]), dtype="float32", device="cpu", kernel_backend=kernel_backend),
                             quark_run["reference"])


def assert_scores_like_quark(llm, ref: dict, atol: float = 2e-4) -> None:
    """Every prompt position's log-probs within atol of Quark's in-memory model; the greedy next token agrees."""
    from atomlite import SamplingParams
    ids = ref["ids"][0].tolist()
    vocab = ref["logits"].shape[-1]
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=vocab))[0]
    expected = torch.log_softmax(ref["logits"][0].float(), dim=-1)
    for pos in range(1, len(ids)):
        got = torch.tensor([out.prompt_logprobs[pos][t] for t in range(vocab)])
        torch.testing.assert_close(got, expected[pos - 1], rtol=0, atol=atol, msg=f"position {pos}")
    assert out.outputs[0].token_ids[0] == int(expected[-1].argmax())


def test_moe_export_stores_each_expert_as_packed_linears(quark_run):
    """Quark (after preprocess_for_quantization) exports per-expert MXFP4 Linears; the router stays float."""
    from safetensors.torch import load_file
    tensors = load_file(quark_run["moe_dir"] / "model.safetensors")
    config = json.loads((quark_run["moe_dir"] / "config.json").read_text())
    experts, hidden, inter = config["num_experts"], config["hidden_size"], config["moe_intermediate_size"]
    for layer in range(2):
        prefix = f"model.layers.{layer}.experts"
        assert f"{prefix}.gate_up_proj" not in tensors
        for e in range(experts):
            for proj, (n, k) in {"gate_proj": (inter, hidden), "up_proj": (inter, hidden),
                                 "down_proj": (hidden, inter)}.items():
                assert tensors[f"{prefix}.{e}.{proj}.weight"].shape == (n, k // 2)
                assert tensors[f"{prefix}.{e}.{proj}.weight_scale"].shape == (n, k // 32)
        assert tensors[f"model.layers.{layer}.router.proj.weight"].is_floating_point()


@pytest.mark.parametrize("kernel_backend", ["torch", "triton"])
def test_moe_model_matches_quarks_quantized_model(quark_run, kernel_backend):
    """MXFP4 experts (stacked from Quark's per-expert tensors) score every position like Quark's own model."""
    from atomlite import LLM
    from atomlite.model_ops.mxfp4_moe import MXFP4Experts
    llm = LLM(str(quark_run["moe_dir"]), dtype="float32", device="cpu", kernel_backend=kernel_backend)
    experts = [m for m in llm.engine.model.modules() if isinstance(m, MXFP4Experts)]
    assert len(experts) == 2 and all(m.backend == kernel_backend for m in experts)
    assert_scores_like_quark(llm, quark_run["moe_reference"])


@pytest.mark.parametrize("kernel_backend", ["torch", "triton"])
def test_moe_with_a_partial_last_block_loads_and_matches_quark(quark_run, kernel_backend):
    """Quark pads a K that is no multiple of 32 (down_proj of intermediate 24): weight [N, 12], scale [N, 1]."""
    from safetensors.torch import load_file

    from atomlite import LLM
    tensors = load_file(quark_run["moe24_dir"] / "model.safetensors")
    assert tensors["model.layers.0.experts.0.down_proj.weight"].shape[1] == PARTIAL_BLOCK_INTERMEDIATE // 2
    assert tensors["model.layers.0.experts.0.down_proj.weight_scale"].shape[1] == 1
    llm = LLM(str(quark_run["moe24_dir"]), dtype="float32", device="cpu", kernel_backend=kernel_backend)
    assert_scores_like_quark(llm, quark_run["moe24_reference"])


def test_moe_checkpoint_with_float_experts_under_an_mxfp4_config_is_refused(quark_run, tmp_path):
    """Quark's ModelQuantizer without preprocess_for_quantization leaves the fused experts float32 while the
    exported config still covers them; loading such a checkpoint names the tensor and the fix."""
    import shutil

    from safetensors.torch import load_file, save_file

    from atomlite import LLM
    from atomlite.errors import ConfigError
    shutil.copytree(quark_run["moe_dir"], tmp_path / "ckpt")
    tensors = load_file(tmp_path / "ckpt" / "model.safetensors")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    experts, hidden, inter = config["num_experts"], config["hidden_size"], config["moe_intermediate_size"]
    for layer in range(2):
        prefix = f"model.layers.{layer}.experts"
        for name in [n for n in tensors if n.startswith(prefix + ".")]:
            del tensors[name]
        tensors[f"{prefix}.gate_up_proj"] = torch.randn(experts, 2 * inter, hidden)
        tensors[f"{prefix}.down_proj"] = torch.randn(experts, hidden, inter)
    save_file(tensors, tmp_path / "ckpt" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"experts\.(gate_up|down)_proj .*preprocess_for_quantization"):
        LLM(str(tmp_path / "ckpt"), dtype="float32", device="cpu")


def test_fp8_kv_export_scales_each_layer_from_its_cached_values(quark_run):
    """Quark's post-RoPE fp8 KV export: one k_proj / v_proj output_scale per layer; atomlite's cache takes them
    (auto = fp8 for this checkpoint)."""
    from safetensors.torch import load_file

    from atomlite import LLM
    tensors = load_file(quark_run["kv_dir"] / "model.safetensors")
    scales = {name: tensors[name].item() for name in tensors if name.endswith("output_scale")}
    assert len(scales) == 4
    llm = LLM(str(quark_run["kv_dir"]), dtype="float32", device="cpu", kernel_backend="torch")
    for i, layer in enumerate(llm.engine.model.attention_layers()):
        assert layer.kv_scales == tuple(scales[f"model.layers.{i}.self_attn.{p}_proj.output_scale"] for p in "kv")
    assert all(spec.dtype == torch.float8_e4m3fn for spec in llm.engine.kv_specs)
    assert "the checkpoint's per-layer scales" in llm.engine.kv_scales_note


def test_fp8_kv_export_scores_like_quarks_model(quark_run):
    """Quark's model quantizes K and V to e4m3 at those scales as it caches them; atomlite's fp8 cache holds the
    same values, so every position scores alike. The reference kernels only: the Triton interpreter's own fp8
    conversion is off (test_kv_fp8.py), so the Triton kernels meet the reference in test_kv_scales.py instead."""
    from atomlite import LLM
    llm = LLM(str(quark_run["kv_dir"]), dtype="float32", device="cpu", kernel_backend="torch")
    assert_scores_like_quark(llm, quark_run["kv_reference"])


def test_pre_rope_kv_scales_are_read_as_not_describing_the_cache(quark_run, tmp_path):
    """The same export marked kv_cache_post_rope false (Quark's default: scales of the raw projections, before
    the K/V norms): atomlite keeps unit scales and says why."""
    import shutil

    from atomlite import LLM
    ckpt = shutil.copytree(quark_run["kv_dir"], tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    config["quantization_config"]["kv_cache_post_rope"] = False
    (ckpt / "config.json").write_text(json.dumps(config))
    llm = LLM(str(ckpt), dtype="float32", device="cpu", kernel_backend="torch")
    assert all(layer.kv_scales == (1.0, 1.0) for layer in llm.engine.model.attention_layers())
    assert "unit scales" in llm.engine.kv_scales_note and "before the K/V norms" in llm.engine.kv_scales_note
    assert llm.engine.kv_specs[0].dtype == torch.float8_e4m3fn


if __name__ == "__main__":
    make_reference(Path(sys.argv[1]))
