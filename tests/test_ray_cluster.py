"""Joining an existing Ray cluster with --address, as a user with `ray start --head` would."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def head_node():
    """A head node with its own temp dir, so teardown kills exactly its processes and no others.
    The module's runs share it, as runs on a user's cluster do."""
    ray = Path(sys.executable).with_name("ray")
    temp = tempfile.mkdtemp(prefix="shoal-ray-", dir="/tmp")  # short: Ray's socket paths are length-limited
    port = free_port()
    proc = subprocess.Popen([str(ray), "start", "--head", f"--port={port}", "--num-cpus=2",
                             "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}", "--block"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.5)
    yield f"127.0.0.1:{port}", Path(temp)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    subprocess.run(["pkill", "-9", "-f", temp], check=False)
    shutil.rmtree(temp, ignore_errors=True)


def actors_started(temp: Path) -> Counter:
    """How many actors of each class the head node's workers have started, by their logs (a
    worker started for an earlier run, or idle, adds to its log when it becomes an actor)."""
    return Counter(line.removeprefix(":actor_name:") for f in (temp / "session_latest" / "logs").glob("worker-*.out")
                   for line in f.read_text().splitlines() if line.startswith(":actor_name:"))


@pytest.mark.parametrize("how", ["--address", "RAY_ADDRESS"])
def test_train_joins_a_running_cluster_by_address(head_node, tmp_path, how):
    """By --address, or by the RAY_ADDRESS that Ray sets for a Ray Job's entrypoint
    (`ray job submit -- shoal train ... --backend ray`)."""
    address, temp = head_node
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    flags = ["--address", address] if how == "--address" else []
    if how == "RAY_ADDRESS":
        env["RAY_ADDRESS"] = address
    before = actors_started(temp)
    p = subprocess.run([sys.executable, "-m", "shoal.cli", "train", "ppo", "--env", "CartPole-v1",
                        "--backend", "ray", *flags, "--num-env-runners", "2",
                        "--total-steps", "2048", "--no-tensorboard",
                        "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    # Said before Ray's start, which is seconds of silence: where the roles go.
    starting, training = p.stderr.splitlines()[:2]
    assert starting == f"ppo CartPole-v1: starting 2 env runners and the learner on the Ray cluster at {address}"
    assert training.startswith("ppo CartPole-v1: training to 2,048 env steps"), p.stderr
    assert (tmp_path / "run" / "checkpoints").is_dir() and (tmp_path / "run" / "curve.png").is_file()
    # The roles ran on that cluster, not on a new local one: its workers' logs name them.
    started = actors_started(temp) - before
    assert started["EnvRunner"] >= 2 and started["PPOLearner"] >= 1, started


def test_a_local_ray_run_prints_no_ray_warnings(tmp_path):
    """A run that starts its own cluster shows shoal's lines only: Ray 2.60 logs a WARNING at every
    new local cluster that it turned token authentication on (it stays on; only the line goes)."""
    p = subprocess.run([sys.executable, "-m", "shoal.cli", "train", "dqn", "--env", "CartPole-v1", "--backend", "ray",
                        "--total-steps", "256", "--no-tensorboard", "--run-dir", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "done: eval return" in out and "WARNING" not in out, out
    assert p.stderr.startswith("dqn CartPole-v1: starting 1 env runner and the learner on a new local Ray cluster\n"
                               "dqn CartPole-v1: training to 256 env steps"), out
