"""Frame-stacked PPO on CartPoleNoVel-v1: shoal (``frame_stack``) vs stable-baselines3's PPO with VecFrameStack.

CartPoleNoVel-v1 is CartPole-v1 with its two velocities set to 0 in the observation (rl-zoo's
benchmark for recurrent policies; shoal registers it). With the last 4 observations stacked, a
feed-forward policy sees motion again. Both frameworks stack 4 and use the settings of shoal's
preset for the env (rl-zoo's ppo_lstm ones) without the LSTM: 8 envs, 32 steps, batch 256,
20 epochs, lr and clip linear from 1e-3 and 0.2, gamma 0.98, GAE 0.8; one ReLU layer of 64 for
the actor and one for the critic. One difference: a new episode's stack is its first
observation repeated in shoal (Gymnasium's FrameStackObservation), zeros before it in SB3's
VecFrameStack. One torch thread each, each run in a fresh process.

Two figures, as ratios of shoal to stable-baselines3 measured in the same run:

1. training throughput: env steps per wall second over ``--steps`` steps of training (sampling
   and updates; no evaluation), after the first iteration;
2. with ``--seeds``, time to a mean evaluation return of 475 (10 deterministic episodes every
   2048 steps, on a 10-env vector env), within 150k steps.

    .venv/bin/python benchmarks/bench_frame_stack.py [--steps 20480] [--seeds 0 1 2]
"""

from __future__ import annotations

import bench_recurrent
from bench_recurrent import BUDGET, ENV, EVAL_EVERY, TARGET
from common import main_against_peer, sb3_steps_per_s, sb3_time_to, shoal_steps_per_s, shoal_time_to

STACK = 4


def shoal_config(seed: int, total_steps: int, **sets):
    """The recurrent benchmark's PPO (the CartPoleNoVel-v1 preset) without its LSTM, on stacks."""
    return bench_recurrent.shoal_config(seed, total_steps, lstm_size=0, frame_stack=STACK, **sets)


def stacked(envs):
    from stable_baselines3.common.vec_env import VecFrameStack

    return VecFrameStack(envs, STACK)


def sb3_model(seed: int):
    import shoal.pomdp  # noqa: F401  (registers CartPoleNoVel-v1)
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    linear = lambda v: (lambda remaining: remaining * v)  # noqa: E731  (rl-zoo's lin_ schedules)
    return PPO("MlpPolicy", stacked(make_vec_env(ENV, n_envs=8, seed=seed)), n_steps=32, batch_size=256,
               gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0, learning_rate=linear(1e-3),
               clip_range=linear(0.2), seed=seed, device="cpu",
               policy_kwargs=dict(ortho_init=False, activation_fn=torch.nn.ReLU, net_arch=dict(pi=[64], vf=[64])))


def shoal_throughput(steps: int) -> float:
    return shoal_steps_per_s(shoal_config(0, 10 * steps, eval_interval=0), steps)


def sb3_throughput(steps: int) -> float:
    return sb3_steps_per_s(sb3_model(0), steps, warmup=256)


def shoal_time(seed: int):
    return shoal_time_to(shoal_config(seed, BUDGET, stop_return=TARGET, eval_interval=EVAL_EVERY), TARGET)


def sb3_time(seed: int):
    import shoal.pomdp  # noqa: F401

    return sb3_time_to(lambda: sb3_model(seed), ENV, TARGET, seed, EVAL_EVERY // 8, BUDGET, wrap=stacked)


def main() -> None:
    main_against_peer("frame_stack", __doc__.splitlines()[0], 20_480, TARGET,
                      {"shoal": shoal_throughput, "stable-baselines3": sb3_throughput},
                      {"shoal": shoal_time, "stable-baselines3": sb3_time})


if __name__ == "__main__":
    main()
