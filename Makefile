# The two commands of the README: `make serve` and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TINY := .cache/tiny-random-gemma4

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# CPU torch first and alone: a plain `torch` requirement would pull a multi-GB CUDA build
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q "triton==3.7.1" -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(PY) -m atomlite.demo.random_model $(TINY)
	$(VENV)/bin/atomlite generate --model $(TINY) --max-tokens 24 "Hello from atomlite"

test: $(STAMP)
	$(PY) -m pytest tests

.PHONY: install serve test
