"""The Ray backend: same code path, same results, real actors."""

import sys
from pathlib import Path

import numpy as np
import pytest

import shoal
from shoal.algos.ppo import PPOConfig
from shoal.algos.sac import SACConfig
from shoal.config import build

# The "ray" group keeps the Ray tests on one xdist worker (`--dist loadgroup`), one cluster at a
# time. Each module starts its own cluster, so none relies on the grouping for correctness.
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    from conftest import start_ray

    start_ray()
    yield
    ray.shutdown()


def sac_config(**kw):
    # 32 steps an iteration with 2 runners: the first, then the 64 random steps left in one rollout
    # each (16 steps per env), then 2 iterations of updates
    return SACConfig(**{"env": "Pendulum-v1", "hidden_sizes": (32, 32), "batch_size": 32, "learning_starts": 96,
                        "rollout_steps": 8, "num_envs_per_runner": 2, "torch_threads": 1, "progress": False,
                        "tensorboard": False, **kw})


@pytest.mark.parametrize("algo", ["ppo", "sac", "sac-2-threads", "ppo-sde",
                                  pytest.param("sac-sde", marks=pytest.mark.slow), "ars"])
def test_ray_and_local_compute_the_same_parameters(ray_cluster, tiny, algo):
    """Switching --backend must change where the algorithm runs, never what it computes (PPO's
    policy recurrent, so the runners' memories travel with their rollouts too; with gSDE, each
    runner's noise matrices, drawn from its own generator; ARS's runners each playing their half
    of the candidates, whose directions they draw from the seed the learner publishes; SAC's
    normalisers, from the runners' observations and returns, on the batches it samples, its
    critics' own learning rate and its reward scale; SAC on 2 torch threads, where the runners on
    Ray run 1, --runner-torch-threads, and the local ones the driver's 2). SAC
    with gSDE runs with the slow tests (16 s in the suite, which took 1,247 s in CI on
    2026-11-29): CI keeps SAC's row and gSDE's runner noise in PPO's."""
    results, steps = {}, {}
    for backend in ("local", "ray"):
        config = {"ppo": lambda: tiny(backend=backend, num_env_runners=2, normalize_obs=True, seed=11, lstm_size=8),
                  "sac": lambda: sac_config(backend=backend, num_env_runners=2, seed=11, normalize_obs=True,
                                            normalize_rewards=True, reward_scale=2.0, critic_lr=1e-3),
                  "sac-2-threads": lambda: sac_config(backend=backend, num_env_runners=2, seed=11, torch_threads=2),
                  "ppo-sde": lambda: tiny(env="Pendulum-v1", backend=backend, num_env_runners=2, seed=11, use_sde=True,
                                          sde_sample_freq=5),
                  "sac-sde": lambda: sac_config(backend=backend, num_env_runners=2, seed=11, use_sde=True),
                  "ars": lambda: shoal.make_config("ars", "CartPole-v1", backend=backend, num_env_runners=2, seed=11,
                                                   n_delta=3, progress=False, tensorboard=False)}[algo]()
        with shoal.make(config) as algo_:
            for _ in range(4):
                metrics = algo_.train()
            assert metrics["learner/policy_version"] == 4
            if algo != "ars":  # (ARS's iterations are as long as their episodes)
                assert metrics["env_steps"] == (512 if algo.startswith("ppo") else 160)  # SAC: 32 + 64 + 32 + 32
            steps[backend] = metrics["env_steps"]
            results[backend] = algo_.backend.get(algo_.learner.call("get_weights"))
    assert steps["local"] == steps["ray"]
    for k, v in results["local"].items():
        np.testing.assert_array_equal(v, results["ray"][k], err_msg=k)


def test_runners_on_ray_run_their_own_torch_threads(ray_cluster):
    """On Ray each runner reserves one CPU, and its process runs runner_torch_threads torch threads
    (1) while the learner's runs torch_threads (2). (That they still compute what local runners on
    the driver's 2 threads do: the sac-2-threads case above.)"""
    import ray
    import torch

    def threads(handle):
        return ray.get(handle.actor.__ray_call__.remote(lambda _: torch.get_num_threads()))

    with shoal.make(sac_config(backend="ray", num_env_runners=2, seed=11, torch_threads=2)) as algo:
        assert [threads(r) for r in algo.runners] == [1, 1] and threads(algo.learner) == 2


@pytest.mark.parametrize("seed, target", [(0, 90), pytest.param(0, 475, marks=pytest.mark.slow),
                                          pytest.param(1, 475, marks=pytest.mark.slow),
                                          pytest.param(2, 475, marks=pytest.mark.slow)])
def test_apex_dqn_learns_cartpole_with_two_runners(ray_cluster, tmp_path, seed, target):
    """Ape-X: runners keep sampling into 2 replay shards while the learner trains from them.
    The solves (475: seed 0 at 22k-27k steps, 110-214 s on two cores) are slow tests (`make
    test-slow`). CI asserts 90, four times a random policy's ~22 (one pushing one way scores ~9):
    seed 0 evaluated 202, 151 and 103 at 4k steps in three runs, then 92-103 until its jump to
    500 at 14k-27k steps. CI asserted 120 until 2026-11-27, which a run on that plateau reached
    at its jump or by chance: it took 40 s to 234 s in the suite. The replay shards and the
    weight store hold NumPy arrays only: their processes never import torch (~190 MB and 2-4 s
    of CPU each)."""
    import ray

    from shoal.algos.dqn import DQNConfig

    config = build(DQNConfig, "dqn", env="CartPole-v1",
                   sets={"backend": "ray", "apex": True, "num_env_runners": 2, "num_replay_shards": 2,
                         "prioritized": True, "rollout_steps": 64, "torch_threads": 1, "seed": seed,
                         "total_steps": 100_000, "stop_return": target, "progress": False, "tensorboard": False})
    holds_torch = {}

    def look(algo, metrics):  # after the first iteration, when every role has stored, sampled or learned
        if not holds_torch:
            roles = {"learner": algo.learner, "store": algo.store,
                     **{f"replay-{i}": shard for i, shard in enumerate(algo.shards)}}
            holds_torch.update({name: ray.get(role.actor.__ray_call__.remote(lambda _: "torch" in sys.modules))
                                for name, role in roles.items()})

    summary = shoal.train(config, run_dir=tmp_path, callback=look)
    assert summary["best_eval_return"] >= target, summary
    assert holds_torch == {"learner": True, "store": False, "replay-0": False, "replay-1": False}
    rows = (tmp_path / "progress.csv").read_text().splitlines()
    assert "learner/policy_lag_mean" in rows[0]


def test_impala_solves_cartpole_with_two_runners(ray_cluster, tmp_path):
    """IMPALA: runners sample without waiting for the learner; V-trace corrects the lag. (PPO
    solves it on Ray with 2 runners through three runner faults, and APPO through a runner's
    crash: tests/test_faults.py.) Its checkpoint restores on Ray."""
    config = shoal.make_config("impala", "CartPole-v1", backend="ray", num_env_runners=2, seed=0, stop_return=475,
                               progress=False, tensorboard=False)
    summary = shoal.train(config, run_dir=tmp_path)
    assert summary["best_eval_return"] >= 475, summary
    from conftest import check_asynchronous_loop

    check_asynchronous_loop(tmp_path, config.num_env_runners)
    with shoal.load(summary["checkpoint"], backend="ray") as algo:
        assert algo.env_steps == summary["env_steps"]
        assert algo.evaluate(episodes=3)["eval/policy_version"] == algo.policy_version


def test_max_policy_lag_drops_stale_rollouts_on_ray(ray_cluster):
    from shoal.algos.impala import IMPALAConfig

    config = IMPALAConfig(env="CartPole-v1", backend="ray", num_env_runners=2, max_policy_lag=0, rollout_steps=8,
                          num_envs_per_runner=2, rollouts_per_update=1, progress=False, tensorboard=False)
    with shoal.make(config) as algo:
        for _ in range(20):
            metrics = algo.train()
        # a script's loop that has not evaluated runs no evaluator: the store, the learner and the
        # runners (one process less to start: 7.1-7.5 s where the five took 9.0-9.2 s for PPO here)
        assert len(algo.backend.actors) == 2 + config.num_env_runners
        assert algo.evaluate(episodes=1)["eval/policy_version"] >= 1
        assert len(algo.backend.actors) == 3 + config.num_env_runners
    # With lag 0 allowed, a runner's rollout sampled while the learner moved on is dropped.
    assert metrics["learner/dropped_rollouts"] > 0
    assert metrics["learner/dropped_steps"] == 16 * metrics["learner/dropped_rollouts"]


def test_runners_waiting_for_cpus_another_run_holds_say_so_and_start_once_they_free(ray_cluster, tiny, caplog,
                                                                                     monkeypatch):
    """Ray keeps an actor that asks for more CPUs than are free pending, silently: a second run
    on a cluster (or a second Algorithm in a notebook) would seem to hang."""
    import logging
    import threading
    import time

    import shoal.backends

    monkeypatch.setattr(shoal.backends, "RUNNER_START_WARN_S", 1.0)
    first = shoal.make(tiny(backend="ray", num_env_runners=2))  # the fixture's cluster has 2 CPUs
    made = {}
    waiting = threading.Thread(target=lambda: made.setdefault("second", shoal.make(tiny(backend="ray"))))
    try:
        with caplog.at_level(logging.WARNING, logger="shoal"):
            waiting.start()
            deadline = time.monotonic() + 30
            while "wait for CPUs" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.2)
            assert waiting.is_alive()  # still waiting for a CPU
            assert ("1 of 1 runners wait for CPUs: each asks for 1, and the Ray cluster has 0 of 2 free (another run, "
                    "or another shoal Algorithm in this process, holds them)") in caplog.text
            assert first.train()["env_steps"] == 128
    finally:
        first.stop()  # frees both CPUs; Ray stays up for the run still using it
    waiting.join(timeout=60)
    assert not waiting.is_alive()
    with made["second"] as second:
        assert second.train()["env_steps"] == 64


def test_train_and_resume_on_ray_say_where_the_roles_start_before_they_do(ray_cluster, tiny, tmp_path):
    """Ray's start is seconds of silence before the first progress line: shoal says what starts, and
    where (here, the cluster this process already runs; a new local one and one joined by address
    in tests/test_ray_cluster.py)."""
    import io
    import re

    from rich.console import Console

    said = io.StringIO()
    console = Console(file=said, width=300)
    shoal.train(tiny(num_env_runners=2, total_steps=128, progress=True), run_dir=tmp_path, console=console)
    assert "starting" not in said.getvalue()  # in-process roles start at once: nothing to say
    shoal.resume(tmp_path, tiny(backend="ray", num_env_runners=2, total_steps=256, progress=True), console=console)
    lines = said.getvalue().splitlines()
    starts = [i for i, line in enumerate(lines)
              if line == "ppo CartPole-v1: starting 2 env runners and the learner on the Ray cluster this "
                         "process already runs"]
    trainings = [i for i, line in enumerate(lines) if re.match(r"ppo CartPole-v1: training to", line)]
    assert len(starts) == 1 and len(trainings) == 2 and trainings[0] < starts[0] < trainings[1], said.getvalue()


def test_central_inference_batches_runners_requests(ray_cluster, tiny):
    """--inference central: runners hold no weights; one server answers both, batching them."""
    config = tiny(backend="ray", num_env_runners=2, inference="central", rollout_steps=32)
    with shoal.make(config) as algo:
        for _ in range(3):
            metrics = algo.train()
        stats = algo.backend.get(algo.inference[0].call("stats"))
        runner_versions = algo.backend.get([r.call("sync_weights") for r in algo.runners])
    assert stats["requests"] == 3 * 2 * 32  # one request per runner per step
    assert stats["batches"] < stats["requests"]  # some forward passes served both runners
    assert stats["version"] == 2 and metrics["learner/policy_lag_max"] == 0
    assert runner_versions == [3, 3]  # (asking a runner to sync loads weights it never needed before)


def test_serve_policy_follows_a_running_trainers_weight_store(ray_cluster, tiny, tmp_path):
    """`shoal serve-policy RUN_DIR --follow`, in its own process, joins the trainer's Ray cluster
    and serves each version the learner publishes, before any checkpoint exists; when the run
    ends it follows the checkpoints."""
    import os
    import select
    import subprocess
    import sys
    import time

    from shoal.remote.policyserver import PolicyClient

    run = tmp_path / "run"
    obs = np.zeros((1, 4), np.float32)
    seen: dict = {}

    def callback(algo, metrics):
        if algo.iteration == 1:
            assert (run / "live.json").is_file() and not list(run.glob("checkpoints/ckpt_*"))
            shoal_cli = str(Path(sys.executable).parent / "shoal")
            # as from another shell: without the RAY_AUTH_MODE that Ray set in this process
            env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
            seen["proc"] = subprocess.Popen([shoal_cli, "serve-policy", str(run), "--follow", "--port", "0"],
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            ready, _, _ = select.select([seen["proc"].stdout], [], [], 120)  # a hung start fails, not hangs
            line = seen["proc"].stdout.readline() if ready else "no line within 120 s"
            assert " on " in line, line
            seen["client"] = PolicyClient(line.split(" on ")[1].split()[0])
            assert seen["client"].act(obs)[1] == algo.policy_version  # the store's weights from the start
        if algo.iteration == 3:  # the learner published 2 more versions since
            deadline = time.monotonic() + 20
            while seen["client"].act(obs)[1] != algo.policy_version and time.monotonic() < deadline:
                time.sleep(0.1)
            seen["followed"] = (seen["client"].act(obs)[1], algo.policy_version)

    config = tiny(backend="ray", num_env_runners=1, total_steps=4 * 64, checkpoint_interval=10_000)
    try:
        summary = shoal.train(config, run_dir=run, callback=callback)
        assert seen["followed"][0] == seen["followed"][1] == 3
        assert not (run / "live.json").exists()  # the run ended: its store is gone with it
        deadline = time.monotonic() + 20
        while seen["client"].act(obs)[1] != 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert seen["client"].act(obs)[1] == 4  # the final checkpoint's version
        assert seen["proc"].poll() is None
        assert Path(summary["checkpoint"]).name.startswith("ckpt_")
        seen["proc"].terminate()  # SIGTERM stops it gracefully, Ray joined or not
        assert seen["proc"].wait(timeout=30) == 0 and seen["proc"].stdout.read().splitlines()[-1] == "stopped"
    finally:
        if "client" in seen:
            seen["client"].close()
        if "proc" in seen:
            seen["proc"].terminate()
            seen["proc"].wait(timeout=30)


SCRIPT_ENV = """
import sys

import gymnasium as gym
import numpy as np
import ray

import shoal


from corridor_base import Base  # a module beside the script, which Ray's workers import too


class Corridor(Base):  # defined in the script itself, as in a notebook; given as a class, as RLlib takes one
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(2, self.t / 10, np.float32), float(action), self.t >= 10, False, {}


config = shoal.PPOConfig(env=Corridor, backend="ray", num_env_runners=1, num_envs_per_runner=2,
                         rollout_steps=16, minibatch_size=32, total_steps=640, eval_episodes=2, progress=False,
                         tensorboard=False)
# two Algorithms in one process, as in a notebook: the first to stop (train's) must leave the Ray
# that shoal started up for the other, and the last one's stop shuts it down
other = shoal.make(config)
print("best", shoal.train(config, run_dir=sys.argv[1])["best_eval_return"], config.env)
print(other.train()["env_steps"], ray.is_initialized())
other.stop()
print(ray.is_initialized())
"""


def test_a_scripts_env_reaches_the_ray_workers_and_ray_outlives_the_first_of_two_algorithms_to_stop(
        ray_cluster, tmp_path, monkeypatch):
    """An env class of the script itself (no module to import it from), registered as gym.register
    in the script would: the run's Ray workers get the registration through Ray's worker setup hook,
    as RLlib users get theirs with register_env, though the class derives from a module beside the
    script. Where Ray was started without it (here: this module's cluster; or by shoal, for another
    env), its workers cannot learn it: one clear line. The script (a fresh process, so that shoal
    starts Ray) also holds a second Algorithm while the first trains and stops: Ray stays up for
    it, and goes with the last stop."""
    import subprocess
    import sys

    import gymnasium as gym

    import shoal.backends

    script = tmp_path / "script.py"
    script.write_text(SCRIPT_ENV)
    (tmp_path / "corridor_base.py").write_text("import gymnasium as gym\n\nclass Base(gym.Env):\n    pass\n")
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path.parent)  # not cwd: the script's own directory is searched
    assert done.returncode == 0, done.stderr[-3000:]
    best, steps, after = done.stdout.splitlines()
    assert best.startswith("best ") and best.endswith(" Corridor"), done.stdout
    assert (steps, after) == ("32 True", "False")

    class Here(gym.Wrapper):
        def __init__(self):
            super().__init__(gym.make("CartPole-v1"))

    gym.register("ShoalTestHere-v0", entry_point=Here)
    for started_for in (None, gym.spec("CartPole-v1")):  # Ray the user started; the Ray shoal started for another env
        monkeypatch.setattr(shoal.backends._RAY, "started", started_for is not None)
        monkeypatch.setattr(shoal.backends._RAY, "script_env", started_for)
        with pytest.raises(shoal.ShoalError, match="^ShoalTestHere-v0 is registered in this process only, and Ray "
                                                   "was started without it .* give the env as "
                                                   "'MODULE:ShoalTestHere-v0'"):
            shoal.make(PPOConfig(env="ShoalTestHere-v0", backend="ray", progress=False))


SIGTERM_AFTER_RAY_STARTS = """
import os, signal, sys, time
from shoal.algos.ppo import PPOConfig
from shoal.backends import RayBackend

got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
backend = RayBackend(PPOConfig(env="CartPole-v1", backend="ray", progress=False))
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.5)
print("handled", got, flush=True)
backend.shutdown()
"""


def test_starting_ray_keeps_the_processs_own_sigterm_handler(tmp_path):
    """ray.init puts a SIGTERM handler of Ray's below Python's (a stack dump, then the process
    dies, uncleaned): where the process had a Python handler (a run starting its roles), it is
    put back, so SIGTERM still stops the run as Ctrl-C does. A fresh process: shoal starts Ray there."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", SIGTERM_AFTER_RAY_STARTS], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and "handled [15]" in done.stdout, (done.returncode, done.stderr[-2000:])
