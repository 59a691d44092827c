"""Envs and policies over gRPC on loopback, as ratios against in-process limits, in one run.

1. CartPole-v1, 64 envs: steps/s through one env server (`shoal serve-env`, its own process)
   vs the same vector env in this process; random actions; p50/p99 round trip per batched step.
   Then the same comparison inside training: PPO (CartPole-v1 preset, 64 envs) env steps/s
   over 10 iterations after a warm-up, envs through the server vs in this process. Where Node.js
   is installed, the same for 64 CartPoles served by the Node.js simulator
   (examples/node_simulator: CartPole-v1 in JavaScript behind grpc-js).
2. Central inference: 32 concurrent clients, each an `ActStream` with one request in flight
   (32 requests always in flight), each asking for the action of one observation, against a
   policy server (`shoal serve-policy`, its own process) that batches them (--max-batch 32,
   --max-wait-ms 1) vs one that runs one forward per request in its handler (--max-batch 1);
   throughput and p50/p99 latency of each. Policies: PPO with 64x64 MLPs (the forward pass is
   cheap next to a gRPC call), 1024x1024 and 2048x2048 (the forward pass dominates, as for
   real models); saved untrained (weights do not change the cost).

3. Central inference inside training: PPO on CartPole-v1, ray backend, 2 runners x 8 envs,
   env steps/s over 10 iterations after a warm-up, `--inference central` vs runners holding
   policy copies, and the inference server's mean batch (runners per forward pass).

    .venv/bin/python benchmarks/bench_remote.py [--seconds 10] [--clients 32]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from common import machine, save

SHOAL = str(Path(sys.executable).parent / "shoal")
NODE_SERVER = (Path(__file__).parent.parent / "examples" / "node_simulator" / "server.js") if shutil.which("node") else None


def start(args: list[str], program: tuple[str, ...] = (SHOAL,)) -> tuple[subprocess.Popen, str]:
    """Start a shoal server process (or ``program``'s) on a free port; returns it and its address."""
    proc = subprocess.Popen([*program, *args, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    line = proc.stdout.readline()
    if " on " not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line}{proc.stdout.read()}")
    return proc, line.split(" on ")[1].split()[0]


def env_steps(env, seconds: float) -> tuple[float, np.ndarray]:
    """Steps per second (env steps, all envs) and per-batch latencies over ``seconds``."""
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    lat = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        a = rng.integers(0, 2, env.num_envs)
        t = time.perf_counter()
        env.step(a)
        lat.append(time.perf_counter() - t)
    return len(lat) * env.num_envs / (time.perf_counter() - start), np.array(lat)


def inference(address: str, clients: int, seconds: float) -> tuple[float, np.ndarray]:
    """Requests per second and latencies with ``clients`` clients, each an ``ActStream`` with one
    request in flight at a time (a simulator asking for its next action), all in one asyncio
    loop so that the client side is not the limit."""
    import asyncio

    import grpc

    from shoal.remote import shoal_pb2 as pb
    from shoal.remote.wire import encode

    request = pb.ActRequest(obs=encode(np.zeros((1, 4), np.float32)), deterministic=True).SerializeToString()

    async def run() -> tuple[float, list[float]]:
        async with grpc.aio.insecure_channel(address) as channel:
            method = channel.stream_stream("/shoal.v1.PolicyService/ActStream")
            lat: list[float] = []

            async def client(stop: float, record: bool) -> None:
                call = method()
                while time.perf_counter() < stop:
                    t = time.perf_counter()
                    await call.write(request)
                    await call.read()
                    if record:
                        lat.append(time.perf_counter() - t)
                await call.done_writing()

            await asyncio.gather(*[client(time.perf_counter() + 0.5, False) for _ in range(clients)])  # warm-up
            start = time.perf_counter()
            await asyncio.gather(*[client(start + seconds, True) for _ in range(clients)])
            return len(lat) / (time.perf_counter() - start), lat

    rate, lat = asyncio.run(run())
    return rate, np.array(lat)


def training_rate(iterations: int = 10, **sets) -> tuple[float, dict]:
    """PPO's env steps/s on CartPole-v1 (its preset, with ``sets`` on top) over ``iterations``
    after a warm-up one; the inference server's counts when there is one."""
    import shoal
    from shoal.algos.ppo import PPOConfig
    from shoal.config import build

    config = build(PPOConfig, "ppo", env="CartPole-v1", sets={"progress": False, "tensorboard": False, **sets})
    with shoal.make(config) as algo:
        algo.train()
        start, steps = time.perf_counter(), algo.env_steps
        for _ in range(iterations):
            algo.train()
        rate = (algo.env_steps - steps) / (time.perf_counter() - start)
        stats = algo.backend.get(algo.inference[0].call("stats")) if algo.inference else {}
    return rate, stats


def served(args: list[str], seconds: float, program: tuple[str, ...] = (SHOAL,)) -> tuple[float, np.ndarray, float]:
    """An env server started with ``args``: its steps/s and latencies with random actions, and
    PPO's training env steps/s on it."""
    from shoal.remote.client import RemoteVectorEnv

    proc, address = start(args, program)
    try:
        remote = RemoteVectorEnv(f"remote://{address}")
        rate, lat = env_steps(remote, seconds)
        remote.close()
        training, _ = training_rate(env=f"remote://{address}", num_envs_per_runner=64)
    finally:
        proc.terminate()
        proc.wait()
    return rate, lat, training


def ms(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q) * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()
    from shoal.envs import make_vector_env

    print(f"machine: {machine()}")
    result: dict = {}
    local_rate, local_lat = env_steps(make_vector_env("CartPole-v1", 64), args.seconds)
    local_training, _ = training_rate(num_envs_per_runner=64)
    remote_rate, remote_lat, remote_training = served(["serve-env", "CartPole-v1", "--num-envs", "64"], args.seconds)
    ratio = remote_rate / local_rate
    print(f"CartPole-v1 x 64 envs: remote {remote_rate:,.0f} steps/s, in-process {local_rate:,.0f} steps/s; "
          f"ratio {ratio:.2f} (target >= 0.5)")
    print(f"  round trip per batched step: p50 {ms(remote_lat, 50):.2f} ms, p99 {ms(remote_lat, 99):.2f} ms "
          f"(in-process step p50 {ms(local_lat, 50):.2f} ms)")
    print(f"  PPO training on them (CartPole-v1 preset, 64 envs): remote {remote_training:,.0f} env steps/s, "
          f"in-process {local_training:,.0f}; ratio {remote_training / local_training:.2f}")
    result["env_server"] = {"remote_steps_per_s": remote_rate, "local_steps_per_s": local_rate, "ratio": ratio,
                            "p50_ms": ms(remote_lat, 50), "p99_ms": ms(remote_lat, 99),
                            "ppo_remote_steps_per_s": remote_training, "ppo_local_steps_per_s": local_training,
                            "ppo_ratio": remote_training / local_training}
    if NODE_SERVER and shutil.which("npm"):
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_SERVER.parent, check=True, capture_output=True)
        node_rate, node_lat, node_training = served(["--num-envs", "64"], args.seconds, ("node", str(NODE_SERVER)))
        print(f"CartPole-v1 x 64 envs served by the Node.js simulator (examples/node_simulator): {node_rate:,.0f} "
              f"steps/s, {node_rate / remote_rate:.2f}x the Python env server's; round trip p50 "
              f"{ms(node_lat, 50):.2f} ms, p99 {ms(node_lat, 99):.2f} ms; PPO training on them {node_training:,.0f} "
              f"env steps/s (on the Python env server {remote_training:,.0f})")
        result["node_simulator"] = {"steps_per_s": node_rate, "vs_python_server": node_rate / remote_rate,
                                     "p50_ms": ms(node_lat, 50), "p99_ms": ms(node_lat, 99),
                                     "ppo_steps_per_s": node_training}

    import shoal
    from shoal.algos.ppo import PPOConfig

    for hidden in ((64, 64), (1024, 1024), (2048, 2048)):
        label = "x".join(map(str, hidden))
        with tempfile.TemporaryDirectory() as d:
            config = PPOConfig(env="CartPole-v1", hidden_sizes=hidden, progress=False, tensorboard=False)
            with shoal.make(config) as algo:
                algo.save(Path(d) / "ckpt")
            rates = {}
            for name, batch in (("batched", args.clients), ("unbatched", 1)):
                proc, address = start(["serve-policy", str(Path(d) / "ckpt"), "--max-batch", str(batch),
                                       "--max-wait-ms", "1"])
                try:
                    rate, lat = inference(address, args.clients, args.seconds)
                finally:
                    proc.terminate()
                    proc.wait()
                rates[name] = rate
                print(f"policy server {label}, {args.clients} clients, {name}: {rate:,.0f} requests/s; "
                      f"latency p50 {ms(lat, 50):.2f} ms, p99 {ms(lat, 99):.2f} ms")
                result[f"inference_{label}_{name}"] = {"requests_per_s": rate, "p50_ms": ms(lat, 50),
                                                       "p99_ms": ms(lat, 99)}
        ratio = rates["batched"] / rates["unbatched"]
        print(f"central inference {label}: batched / unbatched throughput = {ratio:.2f} (target >= 4)")
        result[f"inference_{label}_ratio"] = ratio
    local, _ = training_rate(inference="local", backend="ray", num_env_runners=2)
    central, stats = training_rate(inference="central", backend="ray", num_env_runners=2)
    print(f"PPO training, 2 runners on ray: central inference {central:,.0f} env steps/s, policy copies "
          f"{local:,.0f}; ratio {central / local:.2f}; mean batch {stats['requests'] / stats['batches']:.2f} runners")
    result["central_training"] = {"central": central, "local": local, "ratio": central / local, **stats}
    save("remote", result)


if __name__ == "__main__":
    main()
