"""ARS: shoal vs sb3-contrib's ARS, rl-baselines3-zoo's settings on both (shoal's presets).

- CartPole-v1 (default): the linear policy (no bias, argmax), 8 directions, all used, lr 0.02,
  delta_std 0.05, zero initial weights, raw observations; target 475, an evaluation every 2,000
  steps, 200k steps at most.
- ``--env MountainCarContinuous-v0``: the same with 16 directions and normalised observations
  (SB3's VecNormalize without its reward half); target 90, an evaluation every 10,000 steps,
  500k steps at most.

sb3-contrib plays its candidates one after another in one env (its ``n_envs`` 1); shoal plays
them in the runner's envs at once (8, or as many as the candidates), each env taking the next
candidate as its episode ends. One torch thread on both sides, each run in a fresh process. Two
figures, as ratios of shoal to sb3-contrib measured in the same run:

1. training throughput: env steps per wall second over ``--steps`` steps after the first
   iteration (no evaluation);
2. with ``--seeds``, time to the target (10 deterministic evaluation episodes).

    .venv/bin/python benchmarks/bench_ars.py [--env CartPole-v1] [--steps 50000] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
from functools import partial

from common import main_against_peer, normalized, sb3_steps_per_s, sb3_time_to, shoal_steps_per_s, shoal_time_to

# env: (target, evaluation interval, step budget, sb3-contrib's settings beyond its defaults, normalised)
RUNS = {"CartPole-v1": (475.0, 2_000, 200_000, {}, False),
        "MountainCarContinuous-v0": (90.0, 10_000, 500_000, {"n_delta": 16}, True)}


def shoal_config(env: str, seed: int, total_steps: int, **sets):
    import shoal

    config = shoal.make_config("ars", env, seed=seed, total_steps=total_steps, progress=False, tensorboard=False,
                               torch_threads=1, **sets)
    settings = RUNS[env][3]
    assert config.policy == "linear" and config.n_delta == settings.get("n_delta", 8) and config.n_top is None
    assert config.normalize_obs == RUNS[env][4] and config.lr == 0.02 and config.delta_std == 0.05  # the preset
    return config


def sb3_model(env: str, seed: int):
    import torch
    from sb3_contrib import ARS
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    envs = make_vec_env(env, n_envs=1, seed=seed)
    return ARS("LinearPolicy", normalized(envs) if RUNS[env][4] else envs, seed=seed, device="cpu", **RUNS[env][3])


def shoal_throughput(env: str, steps: int) -> float:
    return shoal_steps_per_s(shoal_config(env, 0, 10 * steps, eval_interval=0), steps)


def sb3_throughput(env: str, steps: int) -> float:
    return sb3_steps_per_s(sb3_model(env, 0), steps, warmup=1)


def shoal_time(env: str, seed: int):
    target, every, budget, _, _ = RUNS[env]
    return shoal_time_to(shoal_config(env, seed, budget, stop_return=target, eval_interval=every, eval_episodes=10),
                         target)


def sb3_time(env: str, seed: int):
    target, every, budget, _, norm = RUNS[env]
    return sb3_time_to(lambda: sb3_model(env, seed), env, target, seed, every, budget,
                       wrap=normalized if norm else lambda envs: envs)


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--env", choices=sorted(RUNS), default="CartPole-v1")
    args, rest = parser.parse_known_args()
    e = args.env
    main_against_peer("ars" if e == "CartPole-v1" else "ars_mountaincar", __doc__.splitlines()[0], 50_000,
                      RUNS[e][0], {"shoal": partial(shoal_throughput, e), "sb3-contrib": partial(sb3_throughput, e)},
                      {"shoal": partial(shoal_time, e), "sb3-contrib": partial(sb3_time, e)}, rest)


if __name__ == "__main__":
    main()
