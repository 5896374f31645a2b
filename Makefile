# fitplan developer tasks. `make demo`, `make serve` and `make test` are the README's commands.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
# torch is pinned: 2.13.0 is the CPU build; an unpinned torch pulls a multi-GB CUDA build.
TORCH := torch==2.13.0
TEST_EXTRAS := transformers==5.24.0 peft==0.21.2
PLUGINS := $(sort $(dir $(wildcard plugins/*/pyproject.toml)))

.PHONY: demo serve test install install-test bench clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

install: $(VENV)/bin/python
	$(PIP) -e .
	$(PY) -m compileall -q src  # bytecode for the editable install (PYTHONDONTWRITEBYTECODE=1 would recompile every run)

install-test: install
	$(PIP) -e '.[test,web]'
	$(PIP) $(TORCH)
	$(PIP) $(TEST_EXTRAS) $(TORCH)
	$(foreach p,$(PLUGINS),$(PIP) --no-deps -e $(p) &&) true

demo: install
	$(VENV)/bin/fitplan estimate --model llama-2-7b --gpu a100-80gb --precision bf16-mixed --optim adamw_torch \
		--per-device-train-batch-size 4 --max-seq-length 2048 --gradient-checkpointing

serve: install
	$(PIP) -e '.[web]'
	$(VENV)/bin/fitplan serve --open

test: install-test
	$(PY) -m pytest -q

bench: install
	$(PIP) -e '.[web]'
	$(PY) bench/bench_estimate.py
	$(PY) bench/bench_cli_startup.py
	$(PY) bench/bench_serve.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
