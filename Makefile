# The two commands of the README: `make serve` and `make test`. Both create .venv on first use, with the torch
# build for this machine (tools/install_torch.sh: ROCm, CUDA or CPU; TORCH_INDEX_URL overrides). Run from an
# active environment (virtualenv or conda) that has torch, the venv sees that torch instead (USE_SYSTEM_TORCH=0
# to install one anyway).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SERVE_STAMP := $(VENV)/.installed-serve
USE_SYSTEM_TORCH ?= $(shell [ -n "$$VIRTUAL_ENV$$CONDA_PREFIX" ] && python3 -c 'import torch' 2>/dev/null && echo 1 || echo 0)

$(VENV)/bin/pip:
	@echo "creating $(VENV) and installing torch for this machine (first run only: a few minutes, about 1.6 GB)"
	python3 -m venv $(if $(filter 1,$(USE_SYSTEM_TORCH)),--system-site-packages) $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	KEEP_TORCH=$(USE_SYSTEM_TORCH) tools/install_torch.sh $(VENV)/bin/pip

# serving needs its extra only; the tests need every extra
$(SERVE_STAMP): pyproject.toml $(VENV)/bin/pip
	@echo "installing atomlite with its serving extra into $(VENV)"
	$(VENV)/bin/pip install -q -e ".[serve]"
	touch $@

$(STAMP): pyproject.toml $(VENV)/bin/pip
	@echo "installing atomlite with every extra into $(VENV) (first run only: a few minutes)"
	$(VENV)/bin/pip install -q -e ".[test,serve,eval,quark]"
	touch $@ $(SERVE_STAMP)

install: $(STAMP)

serve: $(SERVE_STAMP)
	$(VENV)/bin/atomlite serve

test: $(STAMP)
	$(PY) -m pytest tests --durations=15  # about 40 min on 2 cores; the slowest tests are listed at the end

test-vllm:
	tools/vllm_venv.sh
	.venv-vllm/bin/python -m pytest tests/e2e/test_vllm_plugin.py tests/e2e/test_vllm_register.py tests/e2e/test_vllm_kv_layout.py tests/e2e/test_vllm_images.py tests/e2e/test_vllm_serve.py \
		tests/e2e/test_vllm_tensor_parallel.py

accuracy: $(STAMP)
	$(VENV)/bin/atomlite eval --all --level pr --report-dir accuracy-report

.PHONY: install serve test test-vllm accuracy
