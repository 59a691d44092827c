"""TD3 with Ornstein-Uhlenbeck exploration on MountainCarContinuous-v0: shoal vs stable-baselines3.

Both use rl-baselines3-zoo's MountainCarContinuous-v0 TD3 settings (shoal's preset): an
Ornstein-Uhlenbeck process of sigma 0.5 (theta 0.15, dt 0.01) per env, and TD3's defaults
otherwise: 400-300 networks, lr 1e-3, batch 256, gamma 0.99, tau 0.005, 100 random steps, one
update per env step, policy delay 2, target smoothing 0.2 (clip 0.5). 2 torch threads each, each
run in a fresh process. Normal noise of the same sigma does not find the flag (BENCHMARKS.md).

Two figures, as ratios of shoal to SB3 measured in the same run:

1. training throughput: env steps per wall second over ``--steps`` steps of training after the
   first iteration (sampling and updates; no evaluation);
2. with ``--seeds``, time to a mean evaluation return of 90 (10 deterministic episodes every
   5,000 steps, on a 10-env vector env), within 60k steps.

    .venv/bin/python benchmarks/bench_ou_noise.py [--steps 2000] [--seeds 0]
"""

from __future__ import annotations

from common import main_against_peer, sb3_steps_per_s, sb3_time_to, shoal_steps_per_s, shoal_time_to

ENV, TARGET, EVAL_EVERY, BUDGET, SIGMA, THREADS = "MountainCarContinuous-v0", 90.0, 5_000, 60_000, 0.5, 2


def shoal_config(seed: int, total_steps: int, **sets):
    import shoal

    config = shoal.make_config("td3", ENV, seed=seed, total_steps=total_steps, progress=False, tensorboard=False,
                               torch_threads=THREADS, **sets)
    assert config.noise_type == "ornstein-uhlenbeck" and config.action_noise == SIGMA  # the preset
    return config


def sb3_model(seed: int):
    import numpy as np
    import torch
    from stable_baselines3 import TD3
    from stable_baselines3.common.noise import OrnsteinUhlenbeckActionNoise

    torch.set_num_threads(THREADS)
    noise = OrnsteinUhlenbeckActionNoise(mean=np.zeros(1), sigma=SIGMA * np.ones(1), theta=0.15, dt=1e-2)
    return TD3("MlpPolicy", ENV, action_noise=noise, learning_rate=1e-3, batch_size=256, gamma=0.99, tau=0.005,
               learning_starts=100, policy_kwargs={"net_arch": [400, 300]}, seed=seed, device="cpu")


def shoal_throughput(steps: int) -> float:
    return shoal_steps_per_s(shoal_config(0, 10 * steps, eval_interval=0, learning_starts=0), steps)


def sb3_throughput(steps: int) -> float:
    return sb3_steps_per_s(sb3_model(0), steps, warmup=200)


def shoal_time(seed: int):
    return shoal_time_to(shoal_config(seed, BUDGET, stop_return=TARGET, eval_interval=EVAL_EVERY, eval_episodes=10),
                         TARGET)


def sb3_time(seed: int):
    return sb3_time_to(lambda: sb3_model(seed), ENV, TARGET, seed, EVAL_EVERY, BUDGET)


def main() -> None:
    main_against_peer("ou_noise", __doc__.splitlines()[0], 2_000, TARGET,
                      {"shoal": shoal_throughput, "stable-baselines3": sb3_throughput},
                      {"shoal": shoal_time, "stable-baselines3": sb3_time})


if __name__ == "__main__":
    main()
