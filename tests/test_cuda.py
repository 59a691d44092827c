"""--device cuda on a real GPU: what tests/test_device.py's stand-in device cannot show.

Skipped where torch sees no CUDA device (CI has none). Where a GPU is lent, run
``pytest tests/test_cuda.py`` (tests/conftest.py leaves the stand-in device out there): every
learner of test_device.py's cases trains on the GPU and its checkpoint resumes on the GPU and on
the CPU; and CUDA's own sync debug mode, which warns at each operation that makes the host wait
for the GPU's queue (a value read back, a blocking copy either way), finds as many in an
iteration of 6 gradient steps as of 2; runners on --runner-device cuda act there, resume on
either device, and wait for the GPU at most four times a step, with 8 envs as with 1; and
--cuda-graph's updates, replayed from a CUDA graph, are the eager updates to the bit, learn
Pendulum, and wait for the GPU no more often with more of them.
"""

from __future__ import annotations

import collections
import copy
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import shoal
from shoal.algos import make_config
from test_device import (CASES, OFF_POLICY, QUIET, RUNNER_CASES, WAIT_CASES, learner_state, resume_with_runners_on,
                         runner_state, training_length)

SHOAL = str(Path(shoal.__file__).parent)  # shoal's own files: torch syncs once when first used
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


@pytest.mark.parametrize("case", CASES)
def test_every_learner_trains_on_cuda_and_its_checkpoint_resumes_on_either_device(tmp_path, case):
    algo, env, settings = CASES[case]
    state, where = learner_state(make_config(algo, env, device="cuda", **QUIET, **settings),
                                 training_length(algo, settings), save_to=tmp_path / "ck")
    assert where == {"cuda"}
    assert all(np.isfinite(w).all() for w in state["weights"].values())
    for resume_on in ("cpu", "cuda"):
        with shoal.load(tmp_path / "ck", device=resume_on) as resumed:
            assert resumed.learner.obj.device.type == resume_on
            resumed.train()


def syncs_in_an_iteration(config, ready=lambda algo, metrics: metrics.get("learner/updates", 1) != 0
                          ) -> collections.Counter:
    """The places (file:line) in shoal of the operations that wait for the GPU in one iteration of
    training once ``ready(algo, an iteration's metrics)`` (by default: once replay has started the
    updates), each counted as often as it ran."""
    with shoal.make(config) as algo:
        while not ready(algo, algo.train()):
            pass
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                algo.train()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    return collections.Counter(f"{w.filename}:{w.lineno}" for w in caught
                               if "synchroniz" in str(w.message) and w.filename.startswith(SHOAL))


@pytest.mark.parametrize("algo, env, more, settings", WAIT_CASES)
def test_a_learners_updates_make_the_host_wait_for_the_gpu_no_more_often(algo, env, more, settings):
    syncs = {n: syncs_in_an_iteration(make_config(algo, env, device="cuda", **QUIET, **{**settings, more: n}))
             for n in (2, 6)}
    print(f"{algo} {env} {more}: " + "; ".join(f"{n}: {sum(s.values())} {dict(s)}" for n, s in syncs.items()))
    assert sum(syncs[2].values()) == sum(syncs[6].values()), syncs


@pytest.mark.parametrize("case", RUNNER_CASES)
def test_runners_act_on_cuda_and_resume_on_either_device(tmp_path, case):
    algo, env, settings = RUNNER_CASES[case]
    state, where = runner_state(make_config(algo, env, device="cuda", runner_device="cuda", **QUIET, **settings),
                                training_length(algo, settings), save_to=tmp_path / "ck")
    assert where == {"cuda"}
    assert all(np.isfinite(w).all() for w in state["weights"].values())
    for runner_device in ("cpu", "cuda"):  # a CUDA generator's state does not fit a CPU one: reseeded
        resume_with_runners_on(tmp_path / "ck", runner_device)


def test_a_runner_on_cuda_waits_for_it_at_most_four_times_a_step_with_1_env_or_8():
    syncs = {}
    for num_envs in (1, 8):
        config = make_config("dqn", "MiniGrid-Empty-5x5-v0", device="cuda", runner_device="cuda", **QUIET,
                             **{**OFF_POLICY, "num_envs_per_runner": num_envs, "buffer_size": 1000})
        with shoal.make(config) as algo:
            runner = algo.runners[0].obj
            runner.sample(1)
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    runner._rollout(10)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
        syncs[num_envs] = collections.Counter(f"{w.filename}:{w.lineno}" for w in caught
                                              if "synchroniz" in str(w.message) and w.filename.startswith(SHOAL))
    print("runner syncs in 10 steps: " + "; ".join(f"{n} envs: {sum(s.values())} {dict(s)}" for n, s in syncs.items()))
    # a copy back of the env action, the action, its log-probability and the network input a step; the
    # last observations' network input, and the final ones' where an episode ended
    assert max(sum(s.values()) for s in syncs.values()) <= 4 * 10 + 2, syncs


GRAPH_CASES = {  # --cuda-graph's learners, with a learning-rate schedule and prioritised replay among them
    "sac-linear-lr": ("sac", "Pendulum-v1", dict(lr_schedule="linear")),
    "sac-discrete-prioritized": ("sac", "CartPole-v1", dict(prioritized=True)),
    "tqc": ("tqc", "Pendulum-v1", {}),
}


def graph_learners(algo, env, settings):
    """Two learners with the same state on the GPU, with --cuda-graph and without, and a replay to sample from."""
    from shoal.algos import get
    from shoal.envs import env_spaces
    from shoal.runner import EnvRunner
    from shoal.weights import WeightStore

    def learner(cuda_graph):
        config = make_config(algo, env, device="cuda", learning_starts=0, batch_size=64, hidden_sizes=(64, 64),
                             total_steps=2000, cuda_graph=cuda_graph, **settings)
        return get(algo).learner_cls(config, *env_spaces(env), WeightStore()), config

    eager, config = learner(False)
    graphed, _ = learner(True)
    graphed.set_state(copy.deepcopy(eager.get_state()))  # (Adam's state not shared)
    eager.replay.add_rollout(EnvRunner(config, 0, WeightStore()).sample(500))
    return eager, graphed


@pytest.mark.parametrize("case", GRAPH_CASES)
def test_updates_replayed_from_a_cuda_graph_are_the_eager_updates(case):
    """Each learner takes the same 24 batches at a falling learning rate; halfway, the graphed one
    loads a checkpoint of the eager one (Adam's state tensors replaced: the graph is recorded again)."""
    eager, graphed = graph_learners(*GRAPH_CASES[case])
    batches = [eager.replay.sample(64, 0.4)[1] for _ in range(24)]
    worst = 0.0
    for i, batch in enumerate(batches):
        if i == 12:
            graphed.set_state(copy.deepcopy(eager.get_state()))
            assert not graphed.graphed.recorded
        for learner in (eager, graphed):
            learner.scheduled_lr(*learner.optimizers(), env_steps=80 * i)
        (m_e, td_e), (m_g, td_g) = (learner.update_batch(batch.to(learner.device)) for learner in (eager, graphed))
        for k in m_e:
            torch.testing.assert_close(m_g[k], m_e[k], rtol=1e-4, atol=1e-5)
        assert (td_e is None) == (td_g is None)
        if td_e is not None:
            torch.testing.assert_close(td_g, td_e, rtol=1e-4, atol=1e-5)
        theirs = graphed.get_state()["weights"]
        for name, a in eager.get_state()["weights"].items():
            worst = max(worst, float(np.abs(np.asarray(a, float) - np.asarray(theirs[name], float)).max(initial=0)))
    print(f"{case}: largest weight difference over 24 updates {worst:.2e}")
    assert graphed.graphed.recorded and graphed.graphed.failed is None
    assert worst < 1e-4
    assert torch.equal(eager.generator.get_state(), graphed.generator.get_state())  # the graph draws as many


def test_sac_learns_pendulum_with_its_updates_replayed_from_a_cuda_graph(tmp_path):
    config = make_config("sac", "Pendulum-v1", device="cuda", cuda_graph=True, total_steps=20_000, stop_return=-200,
                         eval_interval=2000, eval_episodes=10, progress=False, tensorboard=False, seed=0)
    graphs = []
    summary = shoal.train(config, run_dir=tmp_path, callback=lambda algo, _: graphs.append(algo.learner.obj.graphed))
    print(f"sac --cuda-graph on Pendulum-v1: {summary}")
    assert summary["best_eval_return"] >= -200 and summary["env_steps"] <= 20_000, summary
    assert graphs[-1].recorded and graphs[-1].failed is None


def test_a_graphed_learner_waits_for_the_gpu_no_more_often_with_more_updates():
    syncs = {n: syncs_in_an_iteration(make_config("sac", "Pendulum-v1", device="cuda", cuda_graph=True, **QUIET,
                                                  **{**OFF_POLICY, "updates_per_step": n}),
                                      ready=lambda algo, _: algo.learner.obj.graphed.recorded)
             for n in (2, 6)}
    print("graphed sac: " + "; ".join(f"{n}: {sum(s.values())} {dict(s)}" for n, s in syncs.items()))
    assert sum(syncs[2].values()) == sum(syncs[6].values()), syncs
