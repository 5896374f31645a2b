# fitplan developer tasks. `make demo` and `make test` are the README's two commands; `make serve` opens the web page.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
# torch is pinned: 2.13.0 is the CPU build; an unpinned torch pulls a multi-GB CUDA build.
TORCH := torch==2.13.0
TEST_EXTRAS := transformers==5.24.0 peft==0.21.2
# The libraries behind TrainingArguments.optim names, for the referee (tests/test_optimizer_names.py).
OPTIM_LIBS := bitsandbytes==0.50.2 torchao==0.18.0 galore-torch==1.0 apollo-torch==1.0.3 schedulefree==1.4.1 \
	lomo-optim==0.1.1 grokadamw==0.1.2 torch-optimi==0.3.3
# The stacks the referee runs on the CPU (docs/validation.md, tests/test_stack_referee.py): DeepSpeed ZeRO,
# accelerate, TRL's trainers (preference and RL fine-tuning, docs/trl.md); bitsandbytes (QLoRA) is in OPTIM_LIBS.
STACK_EXTRAS := deepspeed==0.19.8 accelerate==1.16.0 trl==1.16.0
# The referee (fitplan-torch) is a real plugin: installed into .venv. The example plugins (a fictional
# organisation's prices, third-party optimizers) never go into .venv, which `make demo` and a user's
# `pip install` see: they are installed into $(TEST_PLUGINS), which tests/conftest.py puts on sys.path
# (and PYTHONPATH) for the test session only.
PLUGINS := plugins/fitplan-torch
EXAMPLE_PLUGINS := plugins/acme-fitplan-rules plugins/fitplan-optimizers-extra
# plugins/fitplan-settings-example is installed nowhere: its setting would be a scenario field of every test (and of
# every report's scenario); tests/test_settings_example.py registers it for its own tests only.
TEST_PLUGINS := .test-plugins

.PHONY: demo serve test check lint install install-test bench screenshots clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

install: $(VENV)/bin/python
	$(PIP) -e .
	$(PY) -m compileall -q src  # bytecode for the editable install (PYTHONDONTWRITEBYTECODE=1 would recompile every run)

install-test: install
	$(PIP) -e '.[test,web,data]'
	$(PIP) $(TORCH)
	$(PIP) $(TEST_EXTRAS) $(TORCH)
	$(PIP) $(OPTIM_LIBS) $(TEST_EXTRAS) $(TORCH)
	$(PIP) $(STACK_EXTRAS) $(TEST_EXTRAS) $(TORCH)
	$(foreach p,$(PLUGINS),$(PIP) --no-deps -e $(p) &&) true
	$(PY) -m pip uninstall -q -y acme-fitplan-rules fitplan-optimizers-extra 2>/dev/null || true  # an older .venv had them
	rm -rf $(TEST_PLUGINS)
	$(PIP) --no-deps --no-compile --target $(TEST_PLUGINS) $(EXAMPLE_PLUGINS)

# The demo: Llama-3.1-8B fine-tuned as TRL 1.16's SFTTrainer runs it by default on transformers 5.24 (bf16=True over
# the checkpoint's bf16 weights, gradient checkpointing, 8 x 1024 tokens, fused AdamW), 20,000 examples of 600 tokens;
# no --gpu, so the report ends with the cheapest GPU it fits on.
demo: install
	$(VENV)/bin/fitplan estimate --model llama-3.1-8b --bf16 --gradient-checkpointing \
		--per-device-train-batch-size 8 --max-seq-length 1024 --num-examples 20000 --tokens-per-example 600

serve: install
	$(PIP) -e '.[web]'
	$(VENV)/bin/fitplan serve --open

test: install-test
	$(PY) -m pytest -q

# The inner loop: the lint, then every test not marked slow (the referee's torch runs, the plan searches, the browser,
# the demo's venv: tests/conftest.py says which and why), in under two minutes on two cores. Needs a `make install-test`
# once; `make test` (what CI runs) runs everything.
check: lint
	$(PY) -m pytest -q -m "not slow"

lint:
	$(PY) -m ruff check src plugins tests bench

bench: install
	$(PIP) -e '.[web]'
	$(PY) bench/bench_estimate.py
	$(PY) bench/bench_cli_startup.py
	$(PY) bench/bench_serve.py

# Screenshots of the serve page at 1400 px and 390 px, light and dark, for review (DIR=... to choose where).
screenshots: install-test
	$(PY) bench/serve_screenshots.py $(or $(DIR),/tmp/fitplan-screenshots)

clean:
	rm -rf $(VENV) $(TEST_PLUGINS) .pytest_cache .hypothesis
