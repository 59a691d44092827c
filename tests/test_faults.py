"""Fault injection: failing envs, crashed and hung runners, a kill mid-checkpoint, a restarted env
server. In each, PPO still solves CartPole and the counters match what was injected."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time

import pytest
from conftest import check_asynchronous_loop, user_module

import shoal
from shoal.algos.ppo import PPOConfig
from shoal.config import build

FAULTY = "shoal.testing:FaultyCartPole-v1"


def cartpole(seed=0, env=FAULTY, **sets):
    """PPO with its CartPole-v1 preset, on ``env`` (a CartPole that fails on cue, by default)."""
    config = build(PPOConfig, "ppo", env="CartPole-v1", sets={
        "seed": seed, "total_steps": 100_000, "stop_return": 475, "progress": False, "tensorboard": False, **sets})
    return dataclasses.replace(config, env=env)


def last_metrics(run_dir):
    import csv

    rows = list(csv.DictReader(open(run_dir / "progress.csv")))
    return {k: float(v) for k, v in rows[-1].items() if v != ""}


def test_failing_envs_are_replaced_and_a_runner_past_its_limit_is_restarted(tmp_path, monkeypatch):
    # seed 0, 2 runners x 8 envs: runner r's env b is first reset with seed 1000 * (r + 1) + b.
    # Runner 0: env 2 fails at its step 300 (replaced). Runner 1: envs 0 and 1 fail at steps 100
    # and 200; with --max-env-restarts 1 the second failure restarts runner 1 itself.
    monkeypatch.setenv("SHOAL_FAULTS", json.dumps({"1002": [300], "2000": [100], "2001": [200]}))
    config = cartpole(num_env_runners=2, max_env_restarts=1)
    summary = shoal.train(config, run_dir=tmp_path)
    assert summary["best_eval_return"] >= 475, summary
    m = last_metrics(tmp_path)
    assert m["faults/runner_restarts"] == 1
    assert m["faults/env_restarts"] == 2  # runner 0's, and runner 1's first (reported before it failed)
    assert m["faults/dropped_episodes"] == 2 + 8  # one per env failure, and runner 1's 8 episodes in progress


def test_a_failing_env_without_faults_changes_nothing(tmp_path, monkeypatch, tiny):
    """The resilient vector env is Gymnasium's SyncVectorEnv when nothing fails: same parameters."""
    import numpy as np

    monkeypatch.setenv("SHOAL_FAULTS", "{}")
    results = []
    for env in ("CartPole-v1", FAULTY):
        with shoal.make(tiny(env=env, seed=3)) as algo:
            for _ in range(3):
                algo.train()
            results.append(algo.backend.get(algo.learner.call("get_weights")))
    for k, v in results[0].items():
        np.testing.assert_array_equal(v, results[1][k], err_msg=k)


def test_a_kill_during_a_checkpoint_write_loses_nothing(tmp_path):
    """A process killed while writing a checkpoint leaves the previous ones intact; resume goes on
    from the newest complete one and still solves CartPole."""
    run = tmp_path / "run"
    crash = f"""
import os, sys
import shoal.checkpoint as ckpt
original = ckpt.torch.save
calls = [0]
def save(obj, path, *args, **kwargs):
    if ".ckpt_" in str(path) and str(path).endswith("policy.pt"):
        calls[0] += 1
        if calls[0] == 3:  # the third periodic checkpoint: killed after its first file
            original(obj, path, *args, **kwargs)
            os._exit(9)
    return original(obj, path, *args, **kwargs)
ckpt.torch.save = save
from shoal.cli import main
sys.exit(main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", {str(run)!r}, "--no-progress",
               "--checkpoint-interval", "1024", "--total-steps", "100000", "--stop-return", "475"]))
"""
    out = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True, timeout=300)
    assert out.returncode == 9, out.stderr
    from shoal import checkpoint as ckpt

    complete = ckpt.checkpoints_in(run)
    assert len(complete) == 2  # the two written before the kill; the third is not taken as one
    assert list((run / "checkpoints").glob(".ckpt_*.tmp-*"))  # what the kill left half-written
    assert ckpt.resolve(run) == complete[-1]
    resumed = subprocess.run([sys.executable, "-m", "shoal.cli", "train", "--resume", str(run)], capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "solved" in resumed.stderr + resumed.stdout
    assert not list((run / "checkpoints").glob(".ckpt_*.tmp-*"))  # cleaned up by the resumed run


def test_training_goes_on_through_an_env_server_restart(tmp_path):
    """PPO solves CartPole through remote envs spread over two env servers, each serving half the
    steps, though server b is stopped and started again on its port at iteration 5: the runner
    reconnects, and b's 4 episodes in progress are dropped and counted."""
    from shoal.remote.envserver import EnvServer

    a, b = EnvServer("CartPole-v1", 4, port=0).start(), EnvServer("CartPole-v1", 4, port=0).start()
    servers = [a, b]

    def restart_b(algo, metrics):
        if algo.iteration == 5:
            port = servers[1].server.port
            servers[1].stop(grace=0)
            servers[1] = EnvServer("CartPole-v1", 4, port=port).start()

    config = cartpole(env=f"remote://{a.address},{b.address}/CartPole-v1")
    try:
        summary = shoal.train(config, run_dir=tmp_path, callback=restart_b)
    finally:
        for s in servers:
            s.stop(grace=0)
    assert summary["best_eval_return"] >= 475, summary
    m = last_metrics(tmp_path)
    assert m["faults/env_restarts"] == 1 and m["faults/dropped_episodes"] == 4
    assert a.steps_served >= summary["env_steps"] // 2
    assert servers[1].steps_served > 0  # the new server took over b's share


USER_ENVS = """
import gymnasium as gym
import numpy as np


class Sim(gym.Env):  # a user's env: no render_mode argument, as many custom envs are written
    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fault=None):
        if fault == "init":
            raise RuntimeError("cannot reach the simulator")
        self.fault, self.t = fault, 0
        if fault == "start":  # actions -1, 0 and 1, checked
            self.action_space = gym.spaces.Discrete(3, start=-1)
        if fault == "box":  # continuous actions, checked (a NaN is not in the space)
            self.action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action} is not in {self.action_space}")
        self.t += 1
        obs, reward = np.full(3, 0.5, np.float32), 1.0
        if self.fault == "step":
            raise ValueError("the simulator crashed")
        if self.fault == "shape":
            obs = np.zeros(5, np.float32)
        if self.fault == "nan":
            obs[1] = np.nan
        if self.fault == "inf-reward":
            reward = float("inf")
        if self.fault == "none-reward":  # a simulator that forgot to return one
            reward = None
        if self.fault == "array-reward":
            reward = np.array([1.0])
        return obs, reward, self.t >= 20, False, {}


for fault in (None, "init", "step", "shape", "nan", "inf-reward", "none-reward", "array-reward", "start", "box"):
    gym.register(f"Sim{'-' + fault if fault else ''}-v0", entry_point=Sim, kwargs={"fault": fault})
"""


@pytest.mark.parametrize("env, message", [
    ("Sim-init-v0", "environment 'shoal_user_envs:Sim-init-v0' could not be made: RuntimeError: cannot reach the "
                    "simulator (at {module}:"),
    ("Sim-step-v0", "its envs failed 3 times (more than --max-env-restarts 2); the last said ValueError: the "
                    "simulator crashed (at {module}:"),
    ("Sim-shape-v0", "env 0 returned an observation of shape (5,) (float32), where its observation space is "
                     "Box(-1.0, 1.0, (3,), float32)"),
    ("Sim-nan-v0", "env 0 of shoal_user_envs:Sim-nan-v0 returned an observation holding NaN or inf"),
    ("Sim-inf-reward-v0", "env 0 of shoal_user_envs:Sim-inf-reward-v0 returned a reward of inf, which training "
                          "would spread"),
    ("Sim-none-reward-v0", "env 0 of shoal_user_envs:Sim-none-reward-v0 returned a reward of nan (a reward of None is "
                           "stored as NaN), which"),
    ("Sim-array-reward-v0", "env 0 returned the reward array([1.]), terminated False and truncated False: a "
                            "step's reward is one number"),
])
def test_an_env_that_fails_every_time_ends_the_run_in_one_line_and_leaves_no_run_directory(
        tmp_path, monkeypatch, capsys, caplog, env, message):
    """Restarts are for faults that come and go: a runner that fails three times in a row, each
    time before its first rollout, fails the run with what the env said (and where), instead of
    restarting for --max-runner-restarts x the backoff. Nothing is left to resume, so neither is a
    run directory, and the same --run-dir takes the fixed env."""
    from shoal.cli import main

    module = user_module(tmp_path, monkeypatch, "shoal_user_envs", USER_ENVS)
    run = tmp_path / "run"
    argv = ["train", "ppo", "--run-dir", str(run), "--no-progress", "--no-tensorboard", "--total-steps", "512",
            "--max-env-restarts", "2", "--num-envs-per-runner", "1", "--minibatch-size", "64"]
    start = time.monotonic()
    code = main([*argv, "--env", f"shoal_user_envs:{env}"])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("shoal: error: ") and message.format(module=module) in last, err
    if env != "Sim-init-v0":
        assert "runner 0 failed 3 times in a row" in last
        assert sum("restarting it" in r.getMessage() for r in caplog.records) == 2, caplog.text
    assert time.monotonic() - start < 30
    assert not run.exists()
    assert main([*argv, "--env", "shoal_user_envs:Sim-v0"]) == 0  # the same --run-dir, a working env
    assert (run / "config.yaml").exists()


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_discrete_action_space_that_does_not_start_at_zero_gets_actions_from_its_start(
        tmp_path, monkeypatch, algo):
    """Discrete(3, start=-1) takes -1, 0 and 1: runners, evaluations and the deployed policy act in
    those, while networks index 0..2. With --max-env-restarts 0 a single action out of the space
    (the env raises) would fail the run."""
    import numpy as np

    from shoal.cli import main

    user_module(tmp_path, monkeypatch, "shoal_user_envs", USER_ENVS)
    run = tmp_path / algo
    extra = ["--learning-starts", "100"] if algo == "dqn" else ["--minibatch-size", "64"]
    assert main(["train", algo, "--env", "shoal_user_envs:Sim-start-v0", "--run-dir", str(run), "--no-progress",
                 "--no-tensorboard", "--total-steps", "600", "--max-env-restarts", "0", "--eval-episodes", "2",
                 *extra]) == 0
    policy = shoal.load_policy(run)
    actions = policy.act(np.random.default_rng(0).uniform(-1, 1, (200, 3)).astype(np.float32), deterministic=False)
    assert set(np.unique(actions)) <= {-1, 0, 1} and actions.min() == -1


# -- Training that diverges: the learner's fault, named as such, with no runner restarts ---------
DIVERGES = [
    # a loss the learner reports is NaN: it stops before publishing the weights
    ("ppo", "CartPole-v1", 1e38, r"^training diverged: loss/policy is nan, loss/value is nan, loss/entropy is nan in "
                                 r"the updates that made policy version 1 \(at 256 env steps\), so its weights hold "
                                 r"NaN or inf and were not published: lower --lr \(now 1e\+38\), or scale"),
    # one update an iteration: a runner acts with the weights before the next update reports a loss.
    # A2C's weights turn NaN (its sampling raises); SAC's reach 1e30, finite, and its layers overflow.
    ("a2c", "CartPole-v1", 1e38, r"^training diverged: runner 0 \(CartPole-v1\) acts with policy version 1, which "
                                 r"holds NaN or inf in its weights: lower --lr \(now 1e\+38\)"),
    ("sac", "Pendulum-v1", 1e30, r"^training diverged: runner 0 \(Pendulum-v1\) acts with policy version \d+, which "
                                 r"computes NaN or inf from a finite observation \(in a Linear layer\)"),
]


@pytest.mark.parametrize("algo, env, lr, message", DIVERGES)
def test_training_that_diverges_stops_at_once_naming_the_learning_rate_not_the_env(tmp_path, caplog, algo, env, lr,
                                                                                  message):
    """Before, NaN weights reached the runners, which failed three times (restarted twice) and
    ended the run with "fix CartPole-v1": the env was blamed for the learner's divergence."""
    from shoal.errors import Diverged

    config = shoal.make_config(algo, env, lr=lr, total_steps=3000, progress=False, tensorboard=False)
    with pytest.raises(Diverged, match=message):
        shoal.train(config, run_dir=tmp_path / "run")
    assert not any("restarting it" in r.getMessage() for r in caplog.records), caplog.text


def test_weights_gone_nan_are_never_written_as_a_checkpoint(tmp_path):
    """A2C's first update turns its weights NaN with finite losses; a checkpoint due right after it
    refuses them, so a resume would start from the one before, not from ruined weights."""
    from shoal.errors import Diverged

    config = shoal.make_config("a2c", "CartPole-v1", lr=1e38, total_steps=3000, checkpoint_interval=1,
                               progress=False, tensorboard=False)
    with pytest.raises(Diverged, match=r"^training diverged: policy version 1 holds NaN or inf \(in actor\.0\.weight\), "
                                       r"so no checkpoint was written: lower --lr"):
        shoal.train(config, run_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())


@pytest.mark.parametrize("env", ["Pendulum-v1", "shoal_user_envs:Sim-box-v0"])
def test_a_runner_whose_policy_gives_nan_actions_names_the_policy(tmp_path, monkeypatch, env):
    """NaN actions from a finite observation, with finite weights and no layer computing NaN (an
    op outside the layers): the policy is at fault, not the env that passed them on as a NaN
    reward (Pendulum) or raised on them (an env that checks its actions, replaced as failed)."""
    import torch

    from shoal.errors import Diverged
    from shoal.runner import EnvRunner
    from shoal.weights import WeightStore

    user_module(tmp_path, monkeypatch, "shoal_user_envs", USER_ENVS)
    runner = EnvRunner(shoal.make_config("sac", env, num_envs_per_runner=2), 0, WeightStore())
    runner.sample(2)
    monkeypatch.setattr(runner.policy, "explore", lambda x, g: (torch.full((2, 1), float("nan")), torch.zeros(2)))
    with pytest.raises(Diverged, match=rf"^training diverged: runner 0 \({env}\) acts with policy version -1, "
                                       r"which chose NaN or inf actions from a finite observation: lower --lr"):
        runner.sample(2)


# -- Ray: runner actors that crash, are killed, or hang -----------------------------------------
PLAN = {
    # seed 10, runner 0: its first env stalls for 3 minutes at step 150 (the test ray.kills it
    # then), and its replacement's (incarnation 1: seed + 1000 + 1_000_003) first env kills its
    # process at step 100; runner 1's first env stalls for two minutes at step 400
    "1010": ["hang@150:180"], "1001013": ["exit@100"], "2010": ["hang@400:120"],
    "1000": ["exit@200"],  # seed 0: runner 0's first env kills its process at step 200 (APPO)
}


@pytest.fixture(scope="module")
def faulty_ray():
    import ray

    from conftest import start_ray

    start_ray(runtime_env={"env_vars": {"SHOAL_FAULTS": json.dumps(PLAN)}})
    yield
    ray.shutdown()


def solve(algo, budget=100_000):
    """Train until an evaluation reaches 475 or the budget is spent; the best eval return."""
    best = -1.0
    while algo.env_steps < budget and best < 475:
        algo.train()
        if algo.iteration % 4 == 0:
            best = max(best, algo.evaluate()["eval/return_mean"])
    return best


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_runners_killed_crashed_or_hung_are_replaced_and_the_run_still_solves(faulty_ray, caplog):
    """One run, three runner faults (PLAN), each met by a replacement under the same id while the
    other runner's rollout completes the iteration: runner 0 is killed (ray.kill) in a stall in
    iteration 5, its replacement's process dies in iteration 9, runner 1 hangs past
    --runner-timeout-s in iteration 13. A kill and a crash are seen as deaths at once, not waited
    out as hangs. PPO still solves CartPole within its budget: this is also the ray backend's solve
    (PPO's preset, 2 runners, 475 within 100k steps), which a run without faults repeated."""
    import ray

    with shoal.make(cartpole(seed=10, backend="ray", num_env_runners=2, runner_timeout_s=10.0)) as algo:
        for _ in range(4):  # iterations of 32 steps per env: step 150 falls in the 5th
            algo.train()
        victim = algo.runners[0]
        killer = threading.Timer(1.0, lambda: ray.kill(victim.actor))  # while it stalls in step 150
        killer.start()
        metrics = algo.train()  # completes with runner 1's rollout
        killer.join()
        assert metrics["faults/runner_restarts"] == 1 and algo.runners[0] is not victim
        assert solve(algo) >= 475
        m = algo.fault_metrics()
    assert m["faults/runner_restarts"] == 3 and m["faults/dropped_episodes"] == 3 * 8, m
    reasons = [r.getMessage() for r in caplog.records if r.getMessage().endswith("restarting it")]
    assert [r[:len("runner 0 failed (")] for r in reasons] == ["runner 0 failed (", "runner 0 failed (",
                                                               "runner 1 failed ("], reasons
    assert "no reply" not in reasons[0] + reasons[1], reasons  # deaths, found before the 10 s timeout
    assert reasons[2].startswith("runner 1 failed (no reply within 10 s)"), reasons


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_a_learner_that_dies_is_restarted_from_the_newest_checkpoint(faulty_ray, tmp_path):
    """--max-failures 1: the learner actor is killed at iteration 12; the roles are rebuilt from
    the newest checkpoint and the run learns on (to 300 on CartPole). Without it, the run fails clearly,
    also when the runners are the first to find the learner gone (its weights died with it)."""
    import ray

    killed = []

    def kill_learner_at(iteration):
        def kill(algo, metrics):
            if algo.iteration == iteration and not killed:
                killed.append(algo.env_steps)
                ray.kill(algo.learner.actor)
                _, box = ray.get(algo.store.actor.latest.remote("default"))
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:  # until the weights it published are gone with it
                    try:
                        ray.get(box[0], timeout=10)
                        time.sleep(0.2)
                    except ray.exceptions.ObjectLostError:
                        return
                pytest.fail("the killed learner's weights stayed readable for 60 s")
        return kill

    # 512 steps an iteration: after the 12th come an evaluation and a checkpoint, which find it
    # it learns on from the checkpoint: 300 (not a solve, to spare CI time; a random policy has ~22)
    config = cartpole(seed=5, env="CartPole-v1", backend="ray", num_env_runners=2, max_failures=1,
                      checkpoint_interval=2048, stop_return=300)
    summary = shoal.train(config, run_dir=tmp_path, callback=kill_learner_at(12))
    assert killed and summary["failures"] == 1
    assert summary["best_eval_return"] >= 300 and summary["env_steps"] > killed[0], summary
    steps = [int(r.split(",")[1]) for r in (tmp_path / "progress.csv").read_text().splitlines()[1:]]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)  # the log continues from the checkpoint

    # after the 1st nothing else reads the learner (the first evaluation comes after the 4th): the
    # runners fail on its lost weights, and replacing them (which would read the same lost weights)
    # must not be what happens
    killed.clear()
    with pytest.raises(shoal.ShoalError, match="a role failed"):  # without --max-failures it fails clearly
        shoal.train(cartpole(seed=5, env="CartPole-v1", backend="ray", num_env_runners=2, max_runner_restarts=2),
                    run_dir=tmp_path / "again", callback=kill_learner_at(1))
    assert killed


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_the_asynchronous_loop_replaces_a_runner_that_dies_and_solves(faulty_ray, tmp_path):
    """APPO on Ray with 2 runners solves CartPole through a runner's crash (runner 0's process
    dies at its first env's step 200), and its loop stays asynchronous (conftest's check)."""
    config = shoal.make_config("appo", "CartPole-v1", backend="ray", num_env_runners=2, seed=0, stop_return=475,
                               progress=False, tensorboard=False)
    summary = shoal.train(dataclasses.replace(config, env=FAULTY), run_dir=tmp_path)
    assert summary["best_eval_return"] >= 475, summary
    check_asynchronous_loop(tmp_path, config.num_env_runners)
    m = last_metrics(tmp_path)
    assert m["faults/runner_restarts"] == 1 and m["faults/dropped_episodes"] == 8


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_training_that_diverges_on_ray_stops_at_once(faulty_ray, tmp_path, caplog):
    """A runner actor's Diverged ends the run as on the local backend: no restart, the same line."""
    from shoal.errors import Diverged

    algo, env, lr, message = DIVERGES[1]
    config = shoal.make_config(algo, env, lr=lr, total_steps=3000, progress=False, tensorboard=False, backend="ray",
                               num_env_runners=2)
    with pytest.raises(Diverged, match=message):
        shoal.train(config, run_dir=tmp_path / "run")
    assert not any("restarting it" in r.getMessage() for r in caplog.records), caplog.text
