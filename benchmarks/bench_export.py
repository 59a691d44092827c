"""Exported policies: ONNX Runtime's time per call of the exported model against ``policy.act``
(PyTorch) on the same policy and observations, one thread each, in the same run.

Two policies: PPO's MLP on CartPole (64x64) and DQN's convolutional encoder on Atari frames
(4x84x84 uint8); one observation per call (a controller stepping one robot) and a batch of 256.

    .venv/bin/python benchmarks/bench_export.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import onnxruntime as ort
import torch

from common import machine, median, save
from shoal.algos import get
from shoal.policy import Policy


def per_call_s(fn, calls: int) -> float:
    """Median of 5 rounds of ``calls`` calls, per call."""
    for _ in range(max(10, calls // 20)):
        fn()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls)
    return median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    cases = [("ppo MLP, CartPole", "ppo", gym.spaces.Box(-5, 5, (4,), np.float32), gym.spaces.Discrete(2)),
             ("dqn CNN, Atari frames", "dqn", gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6))]
    print(f"machine: {machine()}")
    result = {}
    with tempfile.TemporaryDirectory() as d:
        for name, algo, obs_space, action_space in cases:
            config = get(algo).config_cls(env="CartPole-v1")
            policy = Policy(get(algo).make_policy(config, obs_space, action_space), 0, config)
            path = Path(d) / f"{algo}.onnx"
            policy.export_onnx(path)
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            obs_space.seed(0)
            for batch in (1, 256):
                obs = np.stack([obs_space.sample() for _ in range(batch)])
                calls = args.calls if batch == 1 or algo == "ppo" else max(20, args.calls // 100)
                torch_s = per_call_s(lambda: policy.act(obs), calls)
                onnx_s = per_call_s(lambda: session.run(None, {"obs": obs}), calls)
                print(f"{name:22s} batch {batch:3d}: policy.act {torch_s * 1e6:9.1f} us, ONNX Runtime "
                      f"{onnx_s * 1e6:9.1f} us per call ({torch_s / onnx_s:.2f}x as fast)")
                result[f"{algo}_batch{batch}"] = {"torch_us": torch_s * 1e6, "onnx_us": onnx_s * 1e6,
                                                  "speedup": torch_s / onnx_s}
    save("export", result)


if __name__ == "__main__":
    main()
