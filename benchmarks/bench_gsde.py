"""SAC with gSDE on MountainCarContinuous-v0: shoal vs stable-baselines3.

Both use rl-baselines3-zoo's MountainCarContinuous-v0 SAC settings (shoal's preset): gSDE
(use_sde, log_std_init -3.67, a fresh noise matrix per rollout), 64x64 networks, lr 3e-4, batch
512, a fixed temperature of 0.1, rollouts of 32 steps then 32 updates, gamma 0.9999, tau 0.01,
learning from the first step, 50k steps. 2 torch threads each, each run in a fresh process. SAC
with the same settings but Gaussian noise stayed at 0 through 50k steps here (BENCHMARKS.md).

Two figures, as ratios of shoal to SB3 measured in the same run:

1. training throughput: env steps per wall second over ``--steps`` steps of training after the
   first iteration (sampling and updates; no evaluation);
2. with ``--seeds``, time to a mean evaluation return of 90 (10 deterministic episodes every
   5,000 steps, on a 10-env vector env), within 50k steps.

    .venv/bin/python benchmarks/bench_gsde.py [--steps 2048] [--seeds 0]
"""

from __future__ import annotations

from common import main_against_peer, sb3_steps_per_s, sb3_time_to, shoal_steps_per_s, shoal_time_to

ENV, TARGET, EVAL_EVERY, BUDGET, THREADS = "MountainCarContinuous-v0", 90.0, 5_000, 50_000, 2


def shoal_config(seed: int, total_steps: int, **sets):
    import shoal

    config = shoal.make_config("sac", ENV, seed=seed, total_steps=total_steps, progress=False, tensorboard=False,
                               torch_threads=THREADS, **sets)
    assert config.use_sde and config.rollout_steps == 32 and config.alpha == 0.1  # the preset
    return config


def sb3_model(seed: int):
    import torch
    from stable_baselines3 import SAC

    torch.set_num_threads(THREADS)
    return SAC("MlpPolicy", ENV, learning_rate=3e-4, buffer_size=50_000, batch_size=512, ent_coef=0.1,
               train_freq=32, gradient_steps=32, gamma=0.9999, tau=0.01, learning_starts=0, use_sde=True,
               policy_kwargs={"log_std_init": -3.67, "net_arch": [64, 64]}, seed=seed, device="cpu")


def shoal_throughput(steps: int) -> float:
    return shoal_steps_per_s(shoal_config(0, 10 * steps, eval_interval=0), steps)


def sb3_throughput(steps: int) -> float:
    return sb3_steps_per_s(sb3_model(0), steps, warmup=64)


def shoal_time(seed: int):
    return shoal_time_to(shoal_config(seed, BUDGET, stop_return=TARGET, eval_interval=EVAL_EVERY, eval_episodes=10),
                         TARGET)


def sb3_time(seed: int):
    return sb3_time_to(lambda: sb3_model(seed), ENV, TARGET, seed, EVAL_EVERY, BUDGET)


def main() -> None:
    main_against_peer("gsde", __doc__.splitlines()[0], 2_048, TARGET,
                      {"shoal": shoal_throughput, "stable-baselines3": sb3_throughput},
                      {"shoal": shoal_time, "stable-baselines3": sb3_time})


if __name__ == "__main__":
    main()
