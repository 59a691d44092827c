"""The Node.js example drives a real env server from proto/shoal.proto alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import npm_installed

from shoal.remote.envserver import EnvServer

CLIENT = Path(__file__).parent.parent / "examples" / "node_env_client"
TOKEN = "node-client-test-token-0123456789"

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")


@pytest.fixture(scope="module")
def node_client():
    return npm_installed(CLIENT) / "client.js"


def run(client, address, token, steps=200):
    env = {**os.environ, "SHOAL_TOKEN": token}
    return subprocess.run(["node", str(client), address, "--steps", str(steps), "--seed", "3"], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("env_id, low, high", [("CartPole-v1", 8, 60), ("Pendulum-v1", -1800, -700)])
def test_node_client_plays_episodes_of_a_served_env(node_client, env_id, low, high):
    server = EnvServer(env_id, 4, port=0, token=TOKEN).start()
    try:
        out = run(node_client, server.address, TOKEN, steps=400)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["env_id"] == env_id and result["num_envs"] == 4 and result["steps"] == 1600
        assert result["episodes"] > 0 and low < result["mean_return"] < high  # random actions' returns
        assert not server.sessions  # the client closed its session
        bad = run(node_client, server.address, "wrong-token-wrong-token-wrong")
        assert bad.returncode == 1 and "missing or wrong bearer token" in bad.stderr
    finally:
        server.stop(grace=0)
