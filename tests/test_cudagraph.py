"""--cuda-graph where no GPU is: the fallback to eager updates. (tests/test_cuda.py checks the
recorded graph itself against eager updates where a GPU is lent.)"""

from __future__ import annotations

import contextlib
import copy
import logging

import numpy as np
import torch

from shoal.algos import get, make_config
from shoal.cudagraph import GraphedUpdate
from shoal.envs import env_spaces
from shoal.runner import EnvRunner
from shoal.weights import WeightStore


class NoStream:
    def __init__(self, *args):
        pass

    def wait_stream(self, other):
        pass


class UnrecordableGraph:
    """A CUDA graph whose recording fails, as on a torch without graph-safe generators."""

    def register_generator_state(self, generator):
        raise RuntimeError("graph-safe generators are not supported here\nmore detail")


def test_an_update_that_cannot_be_recorded_runs_eagerly_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "Stream", NoStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: NoStream())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", UnrecordableGraph)
    config = make_config("sac", "Pendulum-v1", learning_starts=0, batch_size=32, hidden_sizes=(16, 16))
    eager = get("sac").learner_cls(config, *env_spaces("Pendulum-v1"), WeightStore())
    graphed = get("sac").learner_cls(config, *env_spaces("Pendulum-v1"), WeightStore())
    graphed.set_state(copy.deepcopy(eager.get_state()))
    graphed.graphed = GraphedUpdate(graphed.train_batch, graphed.optimizers, graphed.generator)
    eager.replay.add_rollout(EnvRunner(config, 0, WeightStore()).sample(200))
    with caplog.at_level(logging.WARNING, logger="shoal"):
        for _ in range(6):  # 3 warm-up updates, then a recording that fails, then eager ones
            batch = eager.replay.sample(32, 0.4)[1]
            (m_e, _), (m_g, _) = eager.update_batch(batch), graphed.update_batch(batch)
            assert {k: float(v) for k, v in m_g.items()} == {k: float(v) for k, v in m_e.items()}
    warnings = [r.getMessage() for r in caplog.records if "--cuda-graph" in r.getMessage()]
    assert warnings == ["--cuda-graph: the update could not be recorded as a CUDA graph (RuntimeError: graph-safe "
                        "generators are not supported here); it runs without one"]
    assert not graphed.graphed.recorded
    # the rates and flags the recording set are put back: the optimiser saves and steps as before
    assert all(type(g["lr"]) is float and not g["capturable"] for o in graphed.optimizers() for g in o.param_groups)
    theirs = graphed.get_state()["weights"]
    assert all(np.array_equal(v, theirs[k]) for k, v in eager.get_state()["weights"].items())
