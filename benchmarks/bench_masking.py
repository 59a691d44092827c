"""Action-masked PPO on Taxi: shoal vs sb3-contrib's MaskablePPO, same settings.

Both take Taxi-v4's mask through an ``action_masks()`` method (sb3-contrib's convention; Taxi
gives the same mask in ``info``): the moves that change the taxi's state. Both use PPO's usual
settings (shoal's defaults, stable-baselines3's but for the rollout and batch sizes): 8 envs,
128 steps, batch 256, 10 epochs, lr 3e-4, gamma 0.99, GAE 0.95, clip 0.2, no entropy bonus;
64x64 tanh networks for the actor and the critic. One torch thread each, each run in a fresh
process. Without a mask PPO stays at -200 (every episode timed out) on Taxi for 200k steps.

Two figures, as ratios of shoal to sb3-contrib measured in the same run:

1. training throughput: env steps per wall second over ``--steps`` steps of training (sampling
   and updates; no evaluation), after the first iteration;
2. with ``--seeds``, time to a mean evaluation return of 7 (10 deterministic episodes every
   16,384 steps, on a 10-env vector env; ~8 is the best a policy can average), within 300k steps.

    .venv/bin/python benchmarks/bench_masking.py [--steps 20480] [--seeds 0 1 2]
"""

from __future__ import annotations

import gymnasium as gym
from common import main_against_peer, sb3_steps_per_s, sb3_time_to, shoal_steps_per_s, shoal_time_to

ENV, TARGET, EVAL_EVERY, BUDGET = "MaskedTaxi-v4", 7.0, 16_384, 300_000


class MaskedTaxi(gym.Wrapper):
    """Taxi-v4 with ``action_masks()``: Taxi's own mask of the moves that change its state."""

    def action_masks(self):
        return self.unwrapped.action_mask(self.unwrapped.s)


if ENV not in gym.registry:  # each spawned process imports this file, and registers it too
    gym.register(ENV, entry_point=lambda **kw: MaskedTaxi(gym.make("Taxi-v4", **kw)))


def shoal_config(seed: int, total_steps: int, **sets):
    from shoal.algos.ppo import PPOConfig

    return PPOConfig(env=ENV, seed=seed, total_steps=total_steps, progress=False, tensorboard=False,
                     torch_threads=1, **sets)


def sb3_model(seed: int):
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    return MaskablePPO("MlpPolicy", make_vec_env(ENV, n_envs=8, seed=seed), n_steps=128, batch_size=256,
                       n_epochs=10, learning_rate=3e-4, gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.0,
                       seed=seed, device="cpu")


def shoal_throughput(steps: int) -> float:
    return shoal_steps_per_s(shoal_config(0, 10 * steps, eval_interval=0), steps)


def sb3_throughput(steps: int) -> float:
    return sb3_steps_per_s(sb3_model(0), steps, warmup=1024)


def shoal_time(seed: int):
    return shoal_time_to(shoal_config(seed, BUDGET, stop_return=TARGET, eval_interval=EVAL_EVERY,
                                      eval_episodes=10), TARGET)


def sb3_time(seed: int):
    from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback

    return sb3_time_to(lambda: sb3_model(seed), ENV, TARGET, seed, EVAL_EVERY // 8, BUDGET,
                       eval_callback=MaskableEvalCallback)


def main() -> None:
    main_against_peer("masking", __doc__.splitlines()[0], 20_480, TARGET,
                      {"shoal": shoal_throughput, "sb3-contrib": sb3_throughput},
                      {"shoal": shoal_time, "sb3-contrib": sb3_time})


if __name__ == "__main__":
    main()
