"""MuJoCo: shoal's SAC (default), PPO (--algo ppo) or TRPO (--algo trpo) preset vs stable-baselines3's, same settings.

Both run rl-zoo's MuJoCo settings (shoal's presets), SAC and PPO on HalfCheetah-v5, TRPO on Hopper-v5:

- SAC: each framework's SAC defaults after 10k random steps: 256x256 ReLU networks, lr 3e-4,
  batch 256, a 1M replay, tau 0.005, gamma 0.99, one update per env step, the temperature tuned
  to -|A| from 1.0. Two torch threads each (shoal's off-policy default). An evaluation every
  5000 steps, within 60k steps.
- PPO: rl-zoo's tuned HalfCheetah settings: one env, rollouts of 512 steps, 20 epochs of
  minibatches of 64, lr 2.0633e-5, clip 0.1, gamma 0.98, GAE lambda 0.92, ent_coef 0.000401762,
  vf_coef 0.58096, max_grad_norm 0.8, 256x256 ReLU networks for the actor and the critic from
  torch's default initialisation (SB3's ortho_init=False), a log std of -2, observations and
  rewards normalised (SB3's VecNormalize, its gamma the algorithm's). One torch thread each (its
  minibatches of 64 run fastest on one). An evaluation every 10,240 steps, within 200k steps.
- TRPO (sb3-contrib's): rl-zoo's Hopper settings: 2 envs, rollouts of 1024 steps each, a KL
  limit of 0.01 per action dimension (sb3-contrib's target_kl 0.01 bounds the KL's mean over
  Hopper's 3 dimensions, shoal's max_kl 0.03 its sum: the same bound), 25 conjugate-gradient
  steps with damping 0.1, a line search of 10 steps shrinking by 0.8, 20 epochs of the value
  function in minibatches of 128 at lr 1e-3, gamma 0.99, GAE lambda 0.95, 64x64 tanh networks
  with orthogonal initialisation, observations and rewards normalised. One torch thread each.
  An evaluation every 10,240 steps, within 400k steps.

Each run is in a fresh process. Two figures, as ratios of shoal to stable-baselines3 measured in
the same run:

1. training throughput: env steps per wall second over ``--steps`` steps of training (sampling
   and updates; no evaluation), after SAC's 10k random steps or PPO's or TRPO's first iteration;
2. with ``--seeds``, time to a mean evaluation return of 3000 (10 deterministic episodes of up
   to 1000 steps on a 10-env vector env). On HalfCheetah random actions score ~-280; rl-zoo
   reports ~9,500 for SAC and ~5,800 for PPO after 1M steps. On Hopper standing still scores
   ~1,000; rl-zoo reports ~3,600 for TRPO after 1M steps.

    .venv/bin/python benchmarks/bench_mujoco.py [--algo sac|ppo|trpo] [--steps 1000] [--seeds 0]
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import NamedTuple

from common import main_against_peer, sb3_steps_per_s, sb3_time_to, shoal_steps_per_s, shoal_time_to

TARGET = 3000.0


class Run(NamedTuple):
    env: str
    envs: int
    """Envs stepped side by side (SB3's EvalCallback counts its ``eval_freq`` in steps of them all)."""
    eval_every: int
    budget: int
    """Env steps of a time-to-target run at most."""
    threads: int
    """Torch threads, the same on both sides."""
    throughput_steps: int
    """``--steps``' default."""
    warmup: int
    """Env steps before the throughput is timed: SAC's 10k random ones and a hundred learning
    steps, or an on-policy algorithm's first rollout and update."""


SAC_RANDOM_STEPS = 10_000
RUNS = {"sac": Run("HalfCheetah-v5", 1, 5000, 60_000, 2, 1_000, SAC_RANDOM_STEPS + 100),
        "ppo": Run("HalfCheetah-v5", 1, 10_240, 200_000, 1, 20_480, 512),
        "trpo": Run("Hopper-v5", 2, 10_240, 400_000, 1, 20_480, 2048)}


def shoal_config(algo: str, seed: int, total_steps: int, **sets):
    import shoal

    config = shoal.make_config(algo, RUNS[algo].env, seed=seed, total_steps=total_steps, progress=False,
                               tensorboard=False, torch_threads=RUNS[algo].threads, **sets)
    assert config.num_envs_per_runner == RUNS[algo].envs
    if algo == "sac":
        assert (config.learning_starts, config.lr, config.hidden_sizes) == (SAC_RANDOM_STEPS, 3e-4, (256, 256))
    elif algo == "trpo":
        assert (config.rollout_steps, config.max_kl, config.vf_epochs, config.hidden_sizes,
                config.normalize_rewards) == (1024, 0.03, 20, (64, 64), True)
    else:
        assert (config.rollout_steps, config.hidden_sizes, config.normalize_rewards) == (512, (256, 256), True)
    return config


def sb3_eval_normalized(envs):
    """The evaluation env of a VecNormalize'd model (rl-zoo's): its statistics are the training
    env's, copied at each evaluation by EvalCallback, and not updated by the evaluation."""
    from stable_baselines3.common.vec_env import VecNormalize

    return VecNormalize(envs, training=False, norm_reward=False)


def sb3_model(algo: str, seed: int):
    import torch
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(RUNS[algo].threads)
    env = RUNS[algo].env
    if algo == "sac":
        return SAC("MlpPolicy", env, learning_starts=SAC_RANDOM_STEPS, seed=seed, device="cpu")
    gamma = 0.99 if algo == "trpo" else 0.98
    envs = VecNormalize(make_vec_env(env, n_envs=RUNS[algo].envs, seed=seed), gamma=gamma)  # rl-zoo's: its gamma
    if algo == "trpo":
        from sb3_contrib import TRPO

        return TRPO("MlpPolicy", envs, n_steps=1024, batch_size=128, gamma=gamma, gae_lambda=0.95, target_kl=0.01,
                    cg_max_steps=25, cg_damping=0.1, line_search_shrinking_factor=0.8, line_search_max_iter=10,
                    n_critic_updates=20, learning_rate=1e-3, sub_sampling_factor=1, seed=seed, device="cpu")
    return PPO("MlpPolicy", envs, n_steps=512, batch_size=64, n_epochs=20, learning_rate=2.0633e-5, clip_range=0.1,
               gamma=gamma, gae_lambda=0.92, ent_coef=0.000401762, vf_coef=0.58096, max_grad_norm=0.8,
               policy_kwargs={"log_std_init": -2.0, "ortho_init": False, "activation_fn": torch.nn.ReLU,
                              "net_arch": {"pi": [256, 256], "vf": [256, 256]}}, seed=seed, device="cpu")


def shoal_throughput(algo: str, steps: int) -> float:
    warmup = RUNS[algo].warmup
    return shoal_steps_per_s(shoal_config(algo, 0, warmup + 10 * steps, eval_interval=0), steps, warmup=warmup)


def sb3_throughput(algo: str, steps: int) -> float:
    return sb3_steps_per_s(sb3_model(algo, 0), steps, warmup=RUNS[algo].warmup)


def shoal_time(algo: str, seed: int):
    run = RUNS[algo]
    return shoal_time_to(shoal_config(algo, seed, run.budget, stop_return=TARGET, eval_interval=run.eval_every,
                                      eval_episodes=10), TARGET)


def sb3_time(algo: str, seed: int):
    run = RUNS[algo]
    return sb3_time_to(lambda: sb3_model(algo, seed), run.env, TARGET, seed, run.eval_every // run.envs,
                       run.budget, **({} if algo == "sac" else {"wrap": sb3_eval_normalized}))


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--algo", choices=sorted(RUNS), default="sac")
    args, rest = parser.parse_known_args()
    a = args.algo
    main_against_peer("mujoco" if a == "sac" else f"mujoco_{a}", __doc__.splitlines()[0], RUNS[a].throughput_steps,
                      TARGET,
                      {"shoal": partial(shoal_throughput, a), "stable-baselines3": partial(sb3_throughput, a)},
                      {"shoal": partial(shoal_time, a), "stable-baselines3": partial(sb3_time, a)}, rest)


if __name__ == "__main__":
    main()
