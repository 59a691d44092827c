"""Shared helpers: small configs that train in seconds."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

import fake_device

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# The stand-in device of tests/test_device.py, registered before this process's first backward
# pass: torch's autograd engine sizes its per-device queues then, once, and a device registered
# later has none (an internal assert fails in its first backward). Not where CUDA is: with both,
# every backward on CUDA fails an internal assert of the engine (seen with torch 2.11 on an
# H200); tests/test_cuda.py checks the real device there, and the stand-in's tests are skipped.
if not torch.cuda.is_available():
    fake_device.install()
os.environ.pop("RAY_ADDRESS", None)  # the ray backend would join that cluster; the tests start their own


def small_ppo(**overrides):
    """A PPO config small enough for unit tests (not for learning)."""
    from shoal.algos.ppo import PPOConfig

    values = dict(env="CartPole-v1", num_envs_per_runner=4, rollout_steps=16, minibatch_size=32, num_epochs=2,
                  total_steps=10_000, progress=False, tensorboard=False, eval_episodes=2, eval_interval=0,
                  torch_threads=1)
    values.update(overrides)
    return PPOConfig(**values)


@pytest.fixture
def tiny():
    return small_ppo


def learner_for(config, store=None):
    """The learner of ``config``'s algorithm, built in this process on its env's spaces (with
    ``store``, or a fresh WeightStore), for tests of one update at a time."""
    import gymnasium as gym

    import shoal
    from shoal.weights import WeightStore

    env = gym.make(config.env)
    return shoal.algos.get(config.algo).learner_cls(config, env.observation_space, env.action_space, store or WeightStore())


def record_quantile_losses(monkeypatch, module) -> list:
    """The (estimates, targets) of every quantile Huber loss the algorithm ``module`` (tqc's, qrdqn's)
    takes from now on, in a list; each loss is taken as before."""
    from shoal.offpolicy import quantile_huber_loss

    seen: list = []
    monkeypatch.setattr(module, "quantile_huber_loss",
                        lambda z, target: seen.append((z.detach(), target)) or quantile_huber_loss(z, target))
    return seen


def user_module(tmp_path, monkeypatch, name: str, source: str):
    """Write ``source`` as module ``name`` in ``tmp_path`` and make it importable, as a user's env
    file beside them is (``--env name:EnvId``). A copy imported by an earlier test is dropped, so
    this test's file, with its path, is the one imported. Returns the file's path."""
    import sys

    path = tmp_path / f"{name}.py"
    path.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return path


def raw_call(address, method, payload: bytes, token=None, timeout=5):
    """Send arbitrary bytes to an EnvService method, as a hostile or buggy client could."""
    import grpc

    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/shoal.v1.EnvService/{method}")
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        return call(payload, timeout=timeout, metadata=metadata)


def status_of(fn):
    """The status code and details of the grpc.RpcError that ``fn()`` raises."""
    import grpc

    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


def npm_installed(directory):
    """``directory``'s Node packages, installed from its lock file once (again when the lock file
    is newer than the install). Tests on two xdist workers may ask at once, and `npm ci` empties
    node_modules before it fills it, so a lock on the lock file serialises the check and the
    install, and only a finished install counts (npm writes node_modules/.package-lock.json at the
    end of an install)."""
    import fcntl
    import subprocess

    wanted = directory / "package-lock.json"
    with open(wanted) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        installed = directory / "node_modules" / ".package-lock.json"
        if not installed.is_file() or installed.stat().st_mtime < wanted.stat().st_mtime:
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=directory, check=True, capture_output=True,
                           timeout=300)
    return directory


def start_ray(**kwargs):
    """ray.init for a test module, tried twice: on a loaded 2-core machine a new cluster's GCS can
    miss Ray's start-up deadline once (seen while the other test worker saturated both cores)."""
    import ray

    for attempt in range(2):
        try:
            return ray.init(address="local", include_dashboard=False, num_cpus=2, logging_level="ERROR", **kwargs)
        except Exception:  # Ray raises RuntimeError or a plain Exception for node start-up timeouts
            ray.shutdown()
            if attempt == 1:
                raise


def check_asynchronous_loop(run_dir, num_env_runners):
    """What a run of the asynchronous loop on Ray (IMPALA, APPO) logs in progress.csv: some
    rollouts came from older weights (V-trace corrects the lag), the learner's queue held no more
    than 2 rollouts per runner, and without --max-policy-lag nothing was dropped."""
    import csv

    with open(run_dir / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    assert max(float(r["learner/policy_lag_max"]) for r in rows) >= 1
    assert all(float(r["learner/queue_depth"]) <= 2 * num_env_runners for r in rows)
    assert float(rows[-1]["learner/dropped_rollouts"]) == 0


@contextlib.contextmanager
def serving(env_id, run_dir):
    """A PPO policy trained for 32 steps on ``env_id`` in ``run_dir``, served by a policy server
    (batches of up to 8): yields the policy and a client of the server."""
    import shoal
    from shoal.remote.policyserver import PolicyClient, PolicyServer

    config = shoal.make_config("ppo", env_id, num_envs_per_runner=2, rollout_steps=16, minibatch_size=32,
                               total_steps=32, eval_interval=0, progress=False, tensorboard=False)
    shoal.train(config, run_dir=run_dir)
    server = PolicyServer({"default": run_dir}, port=0, max_batch=8, max_wait_ms=5).start()
    client = PolicyClient(server.address)
    try:
        yield shoal.load_policy(run_dir), client
    finally:
        client.close()
        server.stop(grace=0)


def pytest_runtest_setup(item):
    """A test marked ``alone`` (a learner on 2 torch threads) is skipped beside other pytest workers:
    there each of its ops waits for a core another worker holds, and it runs 5-25x slower, past its
    timeout (`make test-slow` runs these one at a time, without -n)."""
    if item.get_closest_marker("alone") and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        pytest.skip("needs the cores to itself: run it without -n (`make test-slow` does)")
