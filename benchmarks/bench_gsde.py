"""gSDE on MountainCarContinuous-v0: shoal vs stable-baselines3, SAC (default) or PPO (--algo ppo).

Both use rl-baselines3-zoo's MountainCarContinuous-v0 settings (shoal's presets):

- SAC: gSDE (use_sde, log_std_init -3.67, a fresh noise matrix per rollout), 64x64 networks, lr
  3e-4, batch 512, a fixed temperature of 0.1, rollouts of 32 steps then 32 updates, gamma
  0.9999, tau 0.01, learning from the first step; 50k steps, an evaluation every 5,000. SAC with
  the same settings but Gaussian noise stayed at 0 through 50k steps here (BENCHMARKS.md).
- PPO: gSDE (log_std_init -3.29, a fresh noise matrix per rollout) with torch's default
  initialisation (SB3's ortho_init=False), observations normalised (SB3's VecNormalize without
  its reward half), one env, rollouts of 8 steps, 10 epochs of one minibatch of 8, lr 7.77e-5,
  clip 0.1, gamma 0.9999, GAE lambda 0.9, ent_coef 0.00429, vf_coef 0.19, max_grad_norm 5; 64x64
  tanh networks; 20k steps, an evaluation every 2,000.

2 torch threads for SAC and 1 for PPO (its 8-sample minibatches run fastest on one), the same on
both sides, each run in a fresh process. Two figures, as ratios of shoal to SB3 measured in the
same run:

1. training throughput: env steps per wall second over ``--steps`` steps of training after the
   first iteration (sampling and updates; no evaluation);
2. with ``--seeds``, time to a mean evaluation return of 90 (10 deterministic episodes on a
   10-env vector env) within the budget.

    .venv/bin/python benchmarks/bench_gsde.py [--algo sac|ppo] [--steps 2048] [--seeds 0]
"""

from __future__ import annotations

import argparse
from functools import partial

from common import main_against_peer, normalized, sb3_steps_per_s, sb3_time_to, shoal_steps_per_s, shoal_time_to

ENV, TARGET = "MountainCarContinuous-v0", 90.0
# algorithm: (evaluation interval, step budget, torch threads)
RUNS = {"sac": (5_000, 50_000, 2), "ppo": (2_000, 20_000, 1)}


def shoal_config(algo: str, seed: int, total_steps: int, **sets):
    import shoal

    config = shoal.make_config(algo, ENV, seed=seed, total_steps=total_steps, progress=False, tensorboard=False,
                               torch_threads=RUNS[algo][2], **sets)
    assert config.use_sde and config.rollout_steps == {"sac": 32, "ppo": 8}[algo]  # the preset
    return config


def sb3_model(algo: str, seed: int):
    import torch
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(RUNS[algo][2])
    if algo == "sac":
        return SAC("MlpPolicy", ENV, learning_rate=3e-4, buffer_size=50_000, batch_size=512, ent_coef=0.1,
                   train_freq=32, gradient_steps=32, gamma=0.9999, tau=0.01, learning_starts=0, use_sde=True,
                   policy_kwargs={"log_std_init": -3.67, "net_arch": [64, 64]}, seed=seed, device="cpu")
    return PPO("MlpPolicy", normalized(make_vec_env(ENV, n_envs=1, seed=seed)), n_steps=8, batch_size=8,
               n_epochs=10, learning_rate=7.77e-5, clip_range=0.1, gamma=0.9999, gae_lambda=0.9, ent_coef=0.00429,
               vf_coef=0.19, max_grad_norm=5.0, use_sde=True,
               policy_kwargs={"log_std_init": -3.29, "ortho_init": False}, seed=seed, device="cpu")


def shoal_throughput(algo: str, steps: int) -> float:
    return shoal_steps_per_s(shoal_config(algo, 0, 10 * steps, eval_interval=0), steps)


def sb3_throughput(algo: str, steps: int) -> float:
    return sb3_steps_per_s(sb3_model(algo, 0), steps, warmup=64)


def shoal_time(algo: str, seed: int):
    every, budget, _ = RUNS[algo]
    return shoal_time_to(shoal_config(algo, seed, budget, stop_return=TARGET, eval_interval=every, eval_episodes=10),
                         TARGET)


def sb3_time(algo: str, seed: int):
    every, budget, _ = RUNS[algo]
    return sb3_time_to(lambda: sb3_model(algo, seed), ENV, TARGET, seed, every, budget,
                       wrap=normalized if algo == "ppo" else lambda envs: envs)


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--algo", choices=sorted(RUNS), default="sac")
    args, rest = parser.parse_known_args()
    a = args.algo
    main_against_peer("gsde" if a == "sac" else f"gsde_{a}", __doc__.splitlines()[0], 2_048, TARGET,
                      {"shoal": partial(shoal_throughput, a), "stable-baselines3": partial(sb3_throughput, a)},
                      {"shoal": partial(shoal_time, a), "stable-baselines3": partial(sb3_time, a)}, rest)


if __name__ == "__main__":
    main()
