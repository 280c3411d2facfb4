"""tools/install_torch.sh picks the torch build for the machine (asked with --print, nothing installed)."""
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "install_torch.sh"


def chosen(tmp_path, gpu: str | None = None, **env) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    rocm = tmp_path / "rocm"
    if gpu == "nvidia":
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    if gpu == "rocm":
        (rocm / ".info").mkdir(parents=True)
        (rocm / ".info" / "version").write_text("6.4.2-120\n")
    path = f"{bin_dir}:/usr/bin:/bin"
    run = subprocess.run(["bash", str(SCRIPT), "/venv/bin/pip", "--print"], capture_output=True, text=True,
                         env={"PATH": path, "ROCM_PATH": str(rocm), **env}, check=True)
    return run.stdout.strip()


@pytest.mark.parametrize("gpu,env,expected", [
    (None, {}, "torch==2.13.0 triton==3.7.1 --extra-index-url https://download.pytorch.org/whl/cpu"),
    ("nvidia", {}, "install -q torch==2.13.0"),
    ("rocm", {}, "--index-url https://download.pytorch.org/whl/rocm6.4"),
    ("rocm", {"TORCH_INDEX_URL": "https://example.org/whl"}, "--index-url https://example.org/whl"),
    ("nvidia", {"KEEP_TORCH": "1"}, "keeping the environment's torch"),
])
def test_the_torch_build_follows_the_machine(tmp_path, gpu, env, expected):
    out = chosen(tmp_path, gpu, **env)
    assert out.endswith(expected) or expected in out, out
    if gpu == "nvidia" and not env:
        assert "index-url" not in out and "triton" not in out  # the CUDA wheel brings its own triton
