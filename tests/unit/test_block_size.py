"""--block-size's default is the platform's: 64-token blocks on NVIDIA (a Triton attention key tile in one block), 16
on ROCm (AITER's paged decode reads 16-token blocks) and on the CPU; a value given always wins, and `plan --platform`
plans the blocks the engine would take there."""
import pytest
import torch
from click.testing import CliRunner

from atomlite.cli import main
from atomlite.commands.options import default_model
from atomlite.config import EngineConfig
from atomlite.model_ops.platform import Platform

GEMMA_26B = "examples/configs/gemma-4-26B-A4B-it"


@pytest.mark.parametrize("platform,blocks", [(Platform("cuda", "sm_90"), 64), (Platform("cuda"), 64),
                                             (Platform("rocm", "gfx942", has_aiter=True), 16),
                                             (Platform("rocm", "gfx950"), 16), (Platform("cpu"), 16)])
def test_each_platform_has_its_block_size(platform, blocks):
    assert platform.block_size == blocks


def test_the_config_takes_its_devices_block_size_unless_given_one(monkeypatch):
    demo = default_model()
    assert EngineConfig(model=demo, device="cpu").block_size == 16
    assert EngineConfig(model=demo, device="cpu", block_size=32).block_size == 32
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the config asks the GPU nothing else
    monkeypatch.setattr(torch.version, "hip", None)
    assert EngineConfig(model=demo, device="cuda").block_size == 64
    assert EngineConfig(model=demo, device="cpu").block_size == 16
    assert EngineConfig(model=demo, device="cuda", block_size=16).block_size == 16
    monkeypatch.setattr(torch.version, "hip", "6.4")
    assert EngineConfig(model=demo, device="auto").block_size == 16


@pytest.mark.parametrize("flags,blocks", [(["--platform", "sm_90"], 64), (["--platform", "gfx942+aiter"], 16),
                                          (["--platform", "sm_90", "--block-size", "32"], 32), ([], 16)])
def test_a_plan_for_a_platform_plans_its_blocks(flags, blocks):
    result = CliRunner().invoke(main, ["plan", "--model", GEMMA_26B, *flags])
    assert result.exit_code == 0, result.output
    assert f", block size {blocks}, " in result.stdout
