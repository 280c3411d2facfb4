# The two commands of the README: `make serve` and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# CPU torch first and alone: a plain `torch` requirement would pull a multi-GB CUDA build
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q "triton==3.7.1" -e ".[test,serve,eval,quark]"
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/atomlite serve

test: $(STAMP)
	$(PY) -m pytest tests

test-vllm:
	tools/vllm_venv.sh
	.venv-vllm/bin/python -m pytest tests/test_vllm_plugin.py tests/test_vllm_register.py tests/test_vllm_kv_layout.py

accuracy: $(STAMP)
	$(VENV)/bin/atomlite eval --all --level pr --report-dir accuracy-report

.PHONY: install serve test test-vllm accuracy
