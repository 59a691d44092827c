"""SAC on MuJoCo's HalfCheetah-v5: shoal's preset vs stable-baselines3's SAC with the same settings.

Both run rl-zoo's MuJoCo settings, which are SAC's defaults on both sides after 10k random steps:
256x256 ReLU networks, lr 3e-4, batch 256, a 1M replay, tau 0.005, gamma 0.99, one update per
env step, the temperature tuned to -|A| from 1.0. Two torch threads each (shoal's off-policy
default), each run in a fresh process.

Two figures, as ratios of shoal to stable-baselines3 measured in the same run:

1. training throughput: env steps per wall second over ``--steps`` steps of training (sampling
   and one update per step; no evaluation), after the 10k random steps;
2. with ``--seeds``, time to a mean evaluation return of 3000 (10 deterministic episodes of
   1000 steps every 5000 steps, on a 10-env vector env), within 60k steps. Random actions score
   ~-280; rl-zoo's SAC reaches ~9500 after 1M steps.

    .venv/bin/python benchmarks/bench_mujoco.py [--steps 1000] [--seeds 0]
"""

from __future__ import annotations

from common import main_against_peer, sb3_steps_per_s, sb3_time_to, shoal_steps_per_s, shoal_time_to

ENV, TARGET, EVAL_EVERY, BUDGET, RANDOM_STEPS = "HalfCheetah-v5", 3000.0, 5000, 60_000, 10_000


def shoal_config(seed: int, total_steps: int, **sets):
    import shoal

    return shoal.make_config("sac", ENV, seed=seed, total_steps=total_steps, progress=False, tensorboard=False,
                             **sets)


def sb3_model(seed: int):
    import torch
    from stable_baselines3 import SAC

    torch.set_num_threads(2)
    return SAC("MlpPolicy", ENV, learning_starts=RANDOM_STEPS, seed=seed, device="cpu")


def shoal_throughput(steps: int) -> float:
    return shoal_steps_per_s(shoal_config(0, RANDOM_STEPS + 10 * steps, eval_interval=0), steps,
                             warmup=RANDOM_STEPS + 100)


def sb3_throughput(steps: int) -> float:
    return sb3_steps_per_s(sb3_model(0), steps, warmup=RANDOM_STEPS + 100)


def shoal_time(seed: int):
    return shoal_time_to(shoal_config(seed, BUDGET, stop_return=TARGET, eval_interval=EVAL_EVERY), TARGET)


def sb3_time(seed: int):
    return sb3_time_to(lambda: sb3_model(seed), ENV, TARGET, seed, EVAL_EVERY, BUDGET)


def main() -> None:
    main_against_peer("mujoco", __doc__.splitlines()[0], 1_000, TARGET,
                      {"shoal": shoal_throughput, "stable-baselines3": sb3_throughput},
                      {"shoal": shoal_time, "stable-baselines3": sb3_time})


if __name__ == "__main__":
    main()
