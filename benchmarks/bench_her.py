"""SAC with hindsight goals on FetchReach: shoal vs stable-baselines3's SAC + HerReplayBuffer.

Gymnasium-Robotics' FetchReach-v4 (MuJoCo): move the gripper to a goal; reward -1 on each of
the 50 steps that end farther than 5 cm from it. Both sides use shoal's preset, which is
rl-zoo's her.yml for FetchReach, without its observation normalisation unless ``--normalize``
says (the preset normalises; plain, the script turns it off): SAC, 64x64 networks, two
critics, lr 1e-3, gamma 0.95, batch 256, 1,000 random steps, one update per env step, automatic
entropy tuning; 4 hindsight goals per transition with the `future` strategy. shoal stores the
copies when an episode ends (the paper's Algorithm 1); SB3's HerReplayBuffer relabels the same
share (4 in 5) when it samples. Two torch threads each, each run in a fresh process.

Two figures, as ratios of shoal to SB3 measured in the same run:

1. training throughput: env steps per wall second over ``--steps`` steps after the first 1,100
   (sampling and updates, no evaluation);
2. with ``--seeds``, time to a mean evaluation return of -5 (10 deterministic episodes every
   2,000 steps on a 10-env vector env; every episode within reach of its goal for all but ~5
   of its 50 steps), within 20k steps.

``--normalize`` normalises observations on both sides, as rl-zoo's her.yml does: shoal's
``--normalize-obs`` (replay keeps them raw, the learner normalises each batch with the running
statistics of its update) against SB3's VecNormalize(norm_obs=True, norm_reward=False), whose
replay buffer does the same. rl-zoo's ``normalize: true`` also scales rewards; neither side
does here (shoal's preset leaves them: ``--normalize-rewards`` as well took 6k steps, not 4k).

    .venv/bin/python benchmarks/bench_her.py [--normalize] [--steps 3000] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
from functools import partial

import gymnasium as gym
import gymnasium_robotics
from common import main_against_peer, normalized, sb3_steps_per_s, sb3_time_to, shoal_steps_per_s, shoal_time_to

gym.register_envs(gymnasium_robotics)

ENV, TARGET, EVAL_EVERY, BUDGET, WARMUP = "FetchReach-v4", -5.0, 2000, 20_000, 1100


def shoal_config(seed: int, total_steps: int, normalize: bool, **sets):
    import shoal

    return shoal.make_config("sac", ENV, seed=seed, total_steps=total_steps, progress=False, tensorboard=False,
                             torch_threads=2, normalize_obs=normalize, **sets)


def sb3_model(seed: int, normalize: bool):
    import torch
    from stable_baselines3 import SAC, HerReplayBuffer
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(2)
    c = shoal_config(seed, BUDGET, normalize)
    envs = make_vec_env(ENV, n_envs=1, seed=seed)
    return SAC("MultiInputPolicy", normalized(envs) if normalize else envs, learning_rate=c.lr, gamma=c.gamma,
               batch_size=c.batch_size, buffer_size=c.buffer_size, learning_starts=c.learning_starts, tau=c.tau,
               train_freq=1, gradient_steps=1, policy_kwargs={"net_arch": list(c.hidden_sizes)},
               replay_buffer_class=HerReplayBuffer,
               replay_buffer_kwargs={"n_sampled_goal": c.her_goals, "goal_selection_strategy": c.her_strategy},
               seed=seed, device="cpu")


def shoal_throughput(normalize: bool, steps: int) -> float:
    return shoal_steps_per_s(shoal_config(0, 10 * steps + WARMUP, normalize, eval_interval=0), steps, WARMUP)


def sb3_throughput(normalize: bool, steps: int) -> float:
    return sb3_steps_per_s(sb3_model(0, normalize), steps, WARMUP)


def shoal_time(normalize: bool, seed: int):
    return shoal_time_to(shoal_config(seed, BUDGET, normalize, stop_return=TARGET, eval_interval=EVAL_EVERY,
                                      eval_episodes=10), TARGET)


def sb3_time(normalize: bool, seed: int):
    return sb3_time_to(lambda: sb3_model(seed, normalize), ENV, TARGET, seed, EVAL_EVERY, BUDGET,
                       wrap=normalized if normalize else lambda envs: envs)


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--normalize", action="store_true")
    args, rest = parser.parse_known_args()
    n = args.normalize
    main_against_peer("her_normalized" if n else "her", __doc__.splitlines()[0], 3000, TARGET,
                      {"shoal": partial(shoal_throughput, n), "stable-baselines3": partial(sb3_throughput, n)},
                      {"shoal": partial(shoal_time, n), "stable-baselines3": partial(sb3_time, n)}, rest)


if __name__ == "__main__":
    main()
