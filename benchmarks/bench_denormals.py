"""What flushing denormal floats to zero is worth in a real run (shoal's roles turn it on).

Trains DQN on CartPole-v1 with its preset (local backend, one process) for --steps env steps,
twice from the same seed, each in a fresh process: with denormals flushed (what `set_up_torch`
does) and without (torch's default, which SB3 runs with). Prints the time per DQN update in the last --window steps, once
Adam's second moments have had time to decay, and the ratio.

    .venv/bin/python benchmarks/bench_denormals.py [--steps 25000] [--window 8000] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from common import isolated, machine, save


def ms_per_update(flush: bool, steps: int, window: int, threads: int) -> float:
    import shoal
    from shoal.algos.dqn import DQNConfig
    from shoal.config import build

    if not flush:  # shoal's roles turn flushing on: keep torch's default in this process
        torch.set_flush_denormal = lambda on: True
    config = build(DQNConfig, "dqn", env="CartPole-v1", sets={
        "seed": 0, "total_steps": steps, "torch_threads": threads, "progress": False, "tensorboard": False})
    with shoal.make(config) as algo:
        while algo.env_steps < steps - window:
            algo.train()
        updates, start = algo.learner.obj.updates, time.perf_counter()
        while algo.env_steps < steps:
            algo.train()
        return (time.perf_counter() - start) * 1e3 / (algo.learner.obj.updates - updates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25_000)
    parser.add_argument("--window", type=int, default=8_000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    flushed = isolated(ms_per_update, True, args.steps, args.window, args.threads)
    kept = isolated(ms_per_update, False, args.steps, args.window, args.threads)
    print(f"machine: {machine()}; torch threads: {args.threads}")
    print(f"DQN CartPole-v1, env steps {args.steps - args.window:,}-{args.steps:,}: {flushed:.3f} ms per update "
          f"(runner's steps included) with denormals flushed, {kept:.3f} ms without; ratio {flushed / kept:.2f}")
    save("denormals", {"threads": args.threads, "flushed_ms": flushed, "kept_ms": kept, "ratio": flushed / kept})


if __name__ == "__main__":
    main()
