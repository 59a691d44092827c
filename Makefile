# Two commands on a fresh machine: `make demo` and `make test` (see README.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned in pyproject.toml and installed first by name: its CPU wheel is on these
# machines, and a looser resolution downloads gigabytes of CUDA packages.
TORCH := torch==2.13.0

.PHONY: install install-dev install-bench demo test test-slow bench bench-rllib proto clean

# uv installs everything, torch included: the same versions as pip, in 7 s where pip took 58 s on
# a fresh machine (the dev extras). torch's CPU wheel lies where pip's find-links point (its
# configuration or PIP_FIND_LINKS); uv does not read pip's settings, so it is told them. Without
# them the pin resolves on PyPI, as pip's would. The dev install took 42 s where pip (torch, 43 s)
# then uv (the rest, 22 s) took 65 s, caches cold.
# --compile-bytecode: uv leaves compiling to the first import, and where PYTHONDONTWRITEBYTECODE
# is set (these machines and CI) nothing is ever written, so every process (each Ray actor, each
# `shoal` command) compiled ray, numpy, gymnasium and matplotlib again: `import ray` took 1.95 s
# of CPU where it takes 0.71 s compiled.
FIND_LINKS := $(or $(PIP_FIND_LINKS),$(shell $(PY) -m pip config get global.find-links 2>/dev/null))
UV := $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python $(foreach f,$(FIND_LINKS),--find-links $(f)) $(TORCH)

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(BIN)/uv: $(BIN)/python
	$(BIN)/pip install -q uv==0.13.9

install: $(BIN)/python $(BIN)/uv
	$(UV) -e .

install-dev: $(BIN)/python $(BIN)/uv
	$(UV) -e '.[dev,atari,minigrid,export,robotics,mujoco,tune,wandb]'

install-bench: $(BIN)/python $(BIN)/uv
	$(UV) -e '.[dev,atari,minigrid,export,bench,robotics,mujoco,tune,wandb]'

demo: install
	$(BIN)/shoal train ppo --env CartPole-v1 --stop-return 475

# --dist loadgroup keeps tests marked xdist_group on one worker: the Ray tests, so that one Ray
# cluster runs at a time (pytest is pinned at 9.1.1 for it: pytest-xdist#1386).
test: install-dev
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q --durations=15

# Tests marked alone run after the others, one at a time: a learner on 2 torch threads beside
# another busy process on these 2 cores runs 5-25x slower (BENCHMARKS.md, "Torch threads beside
# other busy processes"), and in one `-n 2` run two such tests both ran past their timeouts.
test-slow: install-dev
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q -m "slow and not alone"
	$(BIN)/python -m pytest -q -m "slow and alone"

bench: install-bench
	$(BIN)/python benchmarks/run_all.py

# RLlib against shoal (benchmarks/bench_rllib.py). RLlib pins gymnasium 1.2.2, so it gets a
# virtual environment of its own, with shoal's Ray version and the same torch.
RLLIB_VENV := .venv-rllib
RAY_VERSION := $(shell sed -n 's/.*"ray==\([0-9.]*\)".*/\1/p' pyproject.toml)
$(RLLIB_VENV)/bin/python:
	$(PY) -m venv $(RLLIB_VENV)
	$(RLLIB_VENV)/bin/pip install -q --upgrade pip
	$(RLLIB_VENV)/bin/pip install -q $(TORCH) 'ray[rllib]==$(RAY_VERSION)'

bench-rllib: install $(RLLIB_VENV)/bin/python
	$(BIN)/python benchmarks/bench_rllib.py

# Regenerate the Python messages from proto/shoal.proto (committed; needs the dev extra).
proto: install-dev
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=shoal/remote --pyi_out=shoal/remote proto/shoal.proto

clean:
	rm -rf $(VENV) $(RLLIB_VENV) runs build *.egg-info
