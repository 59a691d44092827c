"""Learners on a GPU (--device cuda) against the same learners on the CPU, and against
stable-baselines3 on the same GPU, in one run: the device check to run where a GPU is lent.

1. Learning on the GPU: PPO to 475 on CartPole-v1 and SAC to -200 on Pendulum-v1 with their
   presets and --device cuda (time and steps), the CPU's in the same run.
2. Throughput, env steps/s with learning: DQN and PPO on Breakout with rl-zoo's Atari settings
   (as bench_atari.py: the Nature CNN, 2 torch threads), the learner on the CPU and on the GPU,
   the learner and the runner on the GPU (--runner-device cuda: the runner's forward passes there,
   as SB3's), and SB3 on the GPU; SAC on Pendulum-v1 (256x256, batch 256, one update a step) on
   the CPU and the GPU.

Each figure comes from a fresh process. Without CUDA it says so and stops; ``--device cpu`` runs
the script's logic with the CPU on both sides (a dry run: its "gpu" figures are the CPU's).

    .venv/bin/python benchmarks/bench_device.py [--device cuda] [--quick] [--throughput-only] [--only dqn ppo]
"""

from __future__ import annotations

import argparse
import time

from bench_atari import DQN, ENV, PPO
from common import isolated, machine, save, shoal_steps_per_s, shoal_time_to

ATARI_SETS = {"dqn": {"num_envs_per_runner": 1, "learning_starts": DQN["learning_starts"],
                      "buffer_size": DQN["buffer_size"], "target_update_interval": 250}, "ppo": {}}


def shoal_rate(algo: str, env: str, device: str, steps: int, warmup: int, runner_device: str = "cpu") -> float:
    """shoal's training env steps/s with the learner on ``device`` and the runner on ``runner_device``."""
    import shoal

    sets = ATARI_SETS[algo] if env == ENV else {}
    config = shoal.make_config(algo, env, device=device, runner_device=runner_device, total_steps=10**9,
                               eval_interval=0, checkpoint_interval=10**9, progress=False, tensorboard=False,
                               torch_threads=2, **sets)
    return shoal_steps_per_s(config, steps, warmup)


def sb3_atari_rate(algo: str, device: str, steps: int) -> float:
    """stable-baselines3's training env steps/s on Breakout with the same settings, on ``device``."""
    import ale_py
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN as SB3DQN
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    torch.set_num_threads(2)
    env = VecFrameStack(make_atari_env(ENV, n_envs=8 if algo == "ppo" else 1, seed=0,
                                       env_kwargs={"frameskip": 1}), n_stack=4)
    cls, kwargs = (SB3PPO, PPO) if algo == "ppo" else (SB3DQN, DQN)
    model = cls("CnnPolicy", env, seed=0, verbose=0, device=device, **kwargs)
    warmup = 1024 if algo == "ppo" else DQN["learning_starts"]
    model.learn(warmup)
    start, first = time.perf_counter(), model.num_timesteps
    model.learn(steps, reset_num_timesteps=False)
    return (model.num_timesteps - first) / (time.perf_counter() - start)


def time_to(algo: str, env: str, device: str, target: float) -> tuple[float, int]:
    """Seconds and env steps of shoal's preset to an evaluation of ``target`` (NaN if not reached)."""
    import shoal

    config = shoal.make_config(algo, env, device=device, stop_return=target, progress=False, tensorboard=False)
    reached = shoal_time_to(config, target)
    return reached.seconds, reached.steps


def cuda_name(device: str) -> str | None:
    """The GPU's name, or None where torch sees none."""
    import torch

    if device == "cpu":
        return "the CPU (a dry run)"
    return torch.cuda.get_device_name(torch.device(device)) if torch.cuda.is_available() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="the device to compare with the CPU (cpu: a dry run)")
    parser.add_argument("--quick", action="store_true", help="a quarter of the steps")
    parser.add_argument("--throughput-only", action="store_true", help="skip the learning runs (part 1)")
    parser.add_argument("--only", nargs="+", choices=["dqn", "ppo", "sac"], default=["dqn", "ppo", "sac"],
                        help="the throughput rows to measure (part 2)")
    args = parser.parse_args()
    name = isolated(cuda_name, args.device)
    if name is None:
        print(f"no CUDA device here (torch sees none): nothing to compare; run this where a GPU is lent, or "
              f"--device cpu for a dry run")
        return
    scale = 4 if args.quick else 1
    print(f"machine: {machine()}; device: {name}", flush=True)
    sides = {"cpu": "cpu", "gpu": args.device}  # the learner's device on each side (cpu twice in a dry run)
    result: dict = {"device": name, "learning": {}, "throughput": {}}
    for algo, env, target in () if args.throughput_only else (("ppo", "CartPole-v1", 475.0),
                                                                 ("sac", "Pendulum-v1", -200.0)):
        runs = {side: isolated(time_to, algo, env, d, target) for side, d in sides.items()}
        result["learning"][f"{algo} {env}"] = runs
        print(f"{algo} {env} to {target:g}: " + ", ".join(f"{side} {s:.1f} s at {n:,d} steps"
                                                         for side, (s, n) in runs.items()), flush=True)
    for algo, env, steps, warmup in (("dqn", ENV, 6000, DQN["learning_starts"]), ("ppo", ENV, 8192, 1024),
                                     ("sac", "Pendulum-v1", 4000, 100)):
        if algo not in args.only:
            continue
        steps //= scale
        rates = {side: isolated(shoal_rate, algo, env, d, steps, warmup) for side, d in sides.items()}
        if env == ENV:
            rates["gpu, runner too"] = isolated(shoal_rate, algo, env, args.device, steps, warmup, args.device)
            rates["sb3 gpu"] = isolated(sb3_atari_rate, algo, args.device, steps)
        result["throughput"][f"{algo} {env}"] = rates
        line = ", ".join(f"{side} {r:,.0f}" for side, r in rates.items())
        ratios = f"gpu/cpu {rates['gpu'] / rates['cpu']:.2f}"
        if env == ENV:
            ratios += (f", shoal/SB3 on the gpu {rates['gpu'] / rates['sb3 gpu']:.2f} "
                       f"(the runner there too: {rates['gpu, runner too'] / rates['sb3 gpu']:.2f})")
        print(f"{algo} {env}, env steps/s over {steps:,} steps: {line}; {ratios}", flush=True)
    print(f"wrote {save('device', result)}")


if __name__ == "__main__":
    main()
