"""atomlite's vLLM plugin entry point: discovered by vLLM in a fresh process, opt-in switches, idempotent,
harmless without vLLM, and clear about unsupported vLLM versions."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from atomlite.plugin.vllm import BACKEND_PATH, version_problem

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (tools/vllm_venv.sh builds the venv for it)")


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATOMLITE_VLLM_")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=clean | env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


DISCOVER = """
    from importlib.metadata import entry_points
    from vllm import ModelRegistry
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    import atomlite.plugin.vllm as plugin

    (ep,) = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "atomlite"]
    assert ep.value == "atomlite.plugin.vllm:register", ep.value
    assert not plugin.registered()
    load_general_plugins()  # vLLM's own discovery, as every vLLM process does it
    assert plugin.registered()
    archs = dict(ModelRegistry.models)
    plugin.register()
    load_general_plugins()
    assert dict(ModelRegistry.models) == archs  # a second register() changes nothing
    print("custom", AttentionBackendEnum.CUSTOM.get_path())
    print("cpu_attn", AttentionBackendEnum.CPU_ATTN.get_path())
    print("atomlite_arch", "AtomliteGemma4ForCausalLM" in ModelRegistry.get_supported_archs())
    print("gemma4", getattr(ModelRegistry.models["Gemma4ForCausalLM"], "module_name", "?"))
"""


def _fields(out: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


@needs_vllm
def test_entry_point_registers_backend_and_model_in_fresh_process():
    got = _fields(run_python(DISCOVER).stdout)
    assert got["custom"] == BACKEND_PATH
    assert got["atomlite_arch"] == "True"
    # opt-in only: vLLM's own CPU backend and Gemma 4 stay in place
    assert got["cpu_attn"] == "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"
    assert got["gemma4"] == "vllm.model_executor.models.gemma4"


@needs_vllm
def test_switches_route_cpu_attention_and_gemma4_to_atomlite():
    got = _fields(run_python(DISCOVER, ATOMLITE_VLLM_CPU_ATTENTION="1", ATOMLITE_VLLM_GEMMA4="1").stdout)
    assert got["cpu_attn"] == BACKEND_PATH
    assert got["gemma4"] == "atomlite.plugin.vllm.model"


def test_register_without_vllm_is_a_harmless_noop():
    proc = run_python("""
        import sys
        sys.modules["vllm"] = None  # makes `import vllm` fail as if it were not installed
        import atomlite.plugin.vllm as plugin
        plugin.register()
        plugin.register()
        print(plugin.registered())
    """)
    assert proc.stdout.strip() == "False" and not proc.stderr


@pytest.mark.parametrize("version", ["0.32.0", "0.32.3", "0.32.0+cpu", "0.32.1.dev4+g1234abc"])
def test_supported_vllm_versions(version):
    assert version_problem(version) is None


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "1.0.0", "dev", "unknown"])
def test_unsupported_vllm_version_says_what_to_do(version):
    problem = version_problem(version)
    assert problem is not None and version in problem and ">=0.32,<0.33" in problem and "install" in problem.lower()


def test_register_with_unsupported_vllm_warns_and_stays_off():
    proc = run_python("""
        import sys, types
        sys.modules["vllm"] = types.SimpleNamespace(__version__="0.31.0")
        import atomlite.plugin.vllm as plugin
        plugin.register()
        print(plugin.registered())
    """)
    assert proc.stdout.strip() == "False"
    assert "vllm 0.31.0 is installed, so the plugin stays off" in proc.stderr
