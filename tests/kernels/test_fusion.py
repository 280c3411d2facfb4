"""Kernel capabilities as the backends declare them, and the link pass that hands each layer's output to the next
in the forms both kernels take (model_ops.fusion), checked on models built on the meta device for several
platforms; the model's own forward is checked linked and unlinked in tests/e2e/test_fusion_parity.py."""
import json

import pytest

from atomlite.config import EngineConfig
from atomlite.engine.llm_engine import construct_model
from atomlite.model_ops import dispatch, kernels
from atomlite.model_ops.platform import Platform
from quark_configs import quark_config
from tiny_models import text_config

SM90, GFX950 = Platform("cuda", "sm_90"), Platform("rocm", "gfx950", has_aiter=True)


@pytest.mark.parametrize("backend", ["aiter", "triton", "torch"])
def test_every_declared_capability_is_a_known_name(backend):
    for op, kernel in kernels.kernels_of(backend).items():
        assert set(kernel.capabilities) <= set(dispatch.CAPABILITIES), op


def test_a_kernel_declaring_an_unknown_capability_or_op_is_refused_at_declaration():
    with pytest.raises(ValueError, match="not kernel capabilities"):
        kernels.declare("rms_norm", "triton", object(), capabilities={"reads_everything"})
    with pytest.raises(ValueError, match="not an op; declare it in model_ops/ops.py"):
        kernels.declare("rms_norm_twice", "triton", object())
    assert kernels.kernel("triton", "rms_norm") is not None  # the backend's own declarations are in
    with pytest.raises(ValueError, match="two rms_norm kernels"):
        kernels.declare("rms_norm", "triton", object(), module="elsewhere")


def test_a_choice_says_what_its_kernel_can_and_refuses_unknown_capabilities():
    norm = dispatch.choose("rms_norm_residual", SM90, dim=64)
    assert norm.can("writes_quantized_rows") and not dispatch.choose("rms_norm_residual", SM90, "torch",
                                                                      dim=64).can("writes_quantized_rows")
    with pytest.raises(ValueError, match="not a kernel capability"):
        norm.can("quantized_rows")


def meta_model(tmp_path, platform: Platform, prefer: str = "auto", mxfp4: bool = True, **variant):
    """A tiny Gemma 4 (MXFP4 as Quark exports it, unless mxfp4=False) built as the engine builds it, on meta."""
    config = text_config("dense", hidden_size=512, intermediate_size=1024, head_dim=128, global_head_dim=256,
                         **variant).to_dict()
    config["architectures"] = ["Gemma4ForCausalLM"]
    config.update(quark_config() if mxfp4 else {})
    (tmp_path / "config.json").write_text(json.dumps(config))
    engine = EngineConfig(model=str(tmp_path), dtype="bfloat16", device="cpu", kernel_backend=prefer)
    return construct_model(engine, "meta", platform)


def test_on_triton_every_producer_hands_its_reader_the_fused_form(tmp_path):
    model = meta_model(tmp_path, SM90).model
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        assert attn.qkv_proj.returns_partial_sums and attn.o_proj.returns_partial_sums
        assert mlp.down_proj.returns_partial_sums and not mlp.gate_up_proj.returns_partial_sums
        assert attn.attn.reader_quantization == attn.o_proj.input_quantization
        assert mlp.act.reader_takes_gated == mlp.down_proj.takes_gated
        after_attention = layer.post_attention_layernorm
        assert after_attention.next_norms == (layer.pre_feedforward_layernorm,)
        assert after_attention.reader_quantization == mlp.gate_up_proj.input_quantization
        following = model.layers[i + 1] if i + 1 < len(model.layers) else None
        after_mlp = layer.post_feedforward_layernorm
        assert after_mlp.next_norms == ((following.input_layernorm,) if following else (model.norm,))
        assert after_mlp.reader_quantization == (following.self_attn.qkv_proj.input_quantization if following
                                                 else None)


def test_where_a_kernel_cannot_the_layers_hand_over_plain_tensors(tmp_path):
    """gfx950 with AITER: the MXFP4 GEMMs are AITER's (no partial sums, no quantized or gated input); the norms
    still compute the next norms with the residual update."""
    model = meta_model(tmp_path, GFX950).model
    layer = model.layers[0]
    assert layer.self_attn.o_proj.backend == "aiter" and not layer.self_attn.o_proj.returns_partial_sums
    assert layer.mlp.act.reader_takes_gated is None and layer.self_attn.attn.reader_quantization is None
    assert layer.post_attention_layernorm.reader_quantization is None
    assert layer.post_attention_layernorm.next_norms == (layer.pre_feedforward_layernorm,)


def test_moe_layers_join_both_branches_in_the_residual_update(tmp_path):
    model = meta_model(tmp_path, SM90, mxfp4=False, enable_moe_block=True, num_experts=4, top_k_experts=2,
                       moe_intermediate_size=256).model
    layer = model.layers[0]
    assert layer.post_attention_layernorm.next_norms == (layer.pre_feedforward_layernorm, layer.router.norm,
                                                         layer.pre_feedforward_layernorm_2)
    assert layer.experts.returns_partial_sums and layer.post_feedforward_layernorm_1.joins_lazily


def test_per_layer_inputs_leave_the_next_norm_to_the_next_layer(tmp_path):
    model = meta_model(tmp_path, SM90, hidden_size_per_layer_input=64, vocab_size_per_layer_input=96).model
    assert all(layer.post_feedforward_layernorm.next_norms == () for layer in model.layers)


def test_link_keeps_each_parameter_under_its_own_name(tmp_path):
    """Links are references kept out of the module tree: the loader finds every parameter where it was."""
    import torch

    from atomlite.models.gemma4 import Gemma4ForCausalLM
    linked = meta_model(tmp_path, SM90)
    with dispatch.use(SM90), torch.device("meta"):
        unlinked = Gemma4ForCausalLM(linked.spec, max_positions=64)
    assert [name for name, _ in linked.named_parameters()] == [name for name, _ in unlinked.named_parameters()]
    assert [name for name, _ in linked.named_modules()] == [name for name, _ in unlinked.named_modules()]


class _Peers:
    def __init__(self, hands_over_rank_partials: bool):
        self.hands_over_rank_partials = hands_over_rank_partials


@pytest.mark.parametrize("custom,peers", [(_Peers(True), True), (_Peers(False), False), (None, False)],
                         ids=["peer memory", "a custom all-reduce that hands over nothing", "none"])
def test_under_tensor_parallelism_row_parallel_shares_go_unsummed_to_a_residual_update_that_sums_them(tmp_path,
                                                                                                        custom, peers):
    """With the group's peer memory (model_ops.peer_memory) the residual updates sum o_proj's and the MLP's (and
    the experts') shares over the ranks themselves; with AITER's custom all-reduce (which hands over nothing) or
    none, each share is all-reduced first."""
    from atomlite import distributed
    from atomlite.distributed import TensorParallel
    tp = TensorParallel(rank=0, size=2, peers=custom)
    with distributed.use(tp):
        model = meta_model(tmp_path, SM90, mxfp4=False, enable_moe_block=True, num_experts=4, top_k_experts=2,
                           moe_intermediate_size=256).model
    for layer in model.layers:
        assert layer.self_attn.o_proj.hands_rank_partials is peers
        assert layer.mlp.down_proj.hands_rank_partials is peers and layer.experts.hands_rank_partials is peers
        assert layer._hands_rank_partials() is peers
        # a share's split-K slices (the experts' slots) go inside its RankPartials, in the calls the exchange takes
        for share in (layer.self_attn.o_proj, layer.mlp.down_proj, layer.experts):
            assert share.shares_partial_sums is peers and not share.returns_partial_sums
