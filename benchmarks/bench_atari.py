"""Atari training throughput: shoal vs stable-baselines3 with the same settings, and both against
the limit of the preprocessed envs' own step rate, in one run.

PPO: rl-zoo's Atari settings (shoal's ALE/* preset): 8 envs, 128 steps per rollout, 4 epochs of
minibatches of 256, on Breakout. DQN: rl-zoo's Atari settings (batch 32, one update per 4 env
steps, the Nature network) with learning starting after 1,000 steps, so that the timed steps are
mostly learning ones. Both frameworks use 2 torch threads, the Nature CNN, 84x84 grayscale frames
stacked by 4 with 4 frames per step (SB3: make_atari_env on frameskip=1, as rl-zoo makes v5 envs,
and VecFrameStack). No evaluation. Each framework's figure comes from a fresh process; a figure
is env steps per second over the whole call (building the model included). Learning is not
compared here: 10M steps are far beyond this machine (see README's Image observations).

TRPO: shoal's ALE/* preset (8 envs, 128 steps, max_kl 0.01, 15 conjugate-gradient steps, the
Fisher-vector products on every 5th state, 10 value epochs of minibatches of 128) against
sb3-contrib's TRPO CnnPolicy with the same numbers (sb3-contrib's TRPO has no entropy bonus, the
preset's 0.01). Their work per iteration differs in two ways:
sb3-contrib's sub_sampling_factor=5 subsamples the whole policy step (gradient and line search
too), shoal's fisher_subsample the Fisher-vector products only; and sb3-contrib's value loss
trains the shared CNN (10 epochs of backward passes through it), shoal's fits the critic's head
on the encoder's features.

    .venv/bin/python benchmarks/bench_atari.py [--ppo-steps 8192] [--dqn-steps 6000] [--trpo-steps 4096]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from common import isolated, machine, save

ENV = "ALE/Breakout-v5"
PPO = dict(n_steps=128, n_epochs=4, batch_size=256, learning_rate=2.5e-4, clip_range=0.1, ent_coef=0.01,
           vf_coef=0.5)
TRPO = dict(n_steps=128, batch_size=128, learning_rate=1e-3, target_kl=0.01, cg_max_steps=15, cg_damping=0.1,
            n_critic_updates=10, sub_sampling_factor=5)
DQN = dict(buffer_size=10_000, learning_rate=1e-4, batch_size=32, learning_starts=1000, train_freq=4,
           gradient_steps=1, target_update_interval=1000, exploration_fraction=0.1, exploration_final_eps=0.01)


def env_limit(steps: int) -> float:
    """Random-action steps/s of shoal's 8 preprocessed Breakout envs (one vector env)."""
    import numpy as np

    from shoal.envs import make_vector_env

    env = make_vector_env(ENV, 8)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(steps // 8):
        env.step(rng.integers(0, 4, 8))
    return steps / (time.perf_counter() - start)


def run_shoal(algo: str, steps: int) -> float:
    import shoal

    sets = {"num_envs_per_runner": 1, "learning_starts": DQN["learning_starts"], "buffer_size": DQN["buffer_size"],
            "target_update_interval": 250} if algo == "dqn" else {}
    config = shoal.make_config(algo, ENV, total_steps=steps, eval_interval=0, checkpoint_interval=10**9,
                               progress=False, tensorboard=False, torch_threads=2, **sets)
    with tempfile.TemporaryDirectory() as d:
        start = time.perf_counter()
        summary = shoal.train(config, run_dir=f"{d}/run")
        return summary["env_steps"] / (time.perf_counter() - start)


def run_sb3(algo: str, steps: int) -> float:
    import ale_py
    import gymnasium as gym
    import torch
    from sb3_contrib import TRPO as SB3TRPO
    from stable_baselines3 import DQN as SB3DQN
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    torch.set_num_threads(2)
    start = time.perf_counter()
    env = VecFrameStack(make_atari_env(ENV, n_envs=1 if algo == "dqn" else 8, seed=0,
                                       env_kwargs={"frameskip": 1}), n_stack=4)
    if algo == "ppo":
        model = SB3PPO("CnnPolicy", env, seed=0, verbose=0, **PPO)
    elif algo == "trpo":
        model = SB3TRPO("CnnPolicy", env, seed=0, verbose=0, **TRPO)
    else:
        model = SB3DQN("CnnPolicy", env, seed=0, verbose=0, **DQN)
    model.learn(steps)
    return model.num_timesteps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ppo-steps", type=int, default=8192)
    parser.add_argument("--dqn-steps", type=int, default=6000)
    parser.add_argument("--trpo-steps", type=int, default=4096)
    parser.add_argument("--algos", nargs="+", default=["ppo", "dqn", "trpo"], choices=["ppo", "dqn", "trpo"])
    args = parser.parse_args()
    print(machine())
    limit = isolated(env_limit, 4096)
    print(f"env limit: {limit:,.0f} steps/s (8 preprocessed {ENV} envs, random actions)")
    result = {"env_limit": limit}
    for algo in args.algos:
        steps = getattr(args, f"{algo}_steps")
        ours, theirs = isolated(run_shoal, algo, steps), isolated(run_sb3, algo, steps)
        result[algo] = {"shoal": ours, "sb3": theirs, "steps": steps}
        print(f"{algo} {steps:,} steps: shoal {ours:,.0f} steps/s, SB3 {theirs:,.0f} -> {ours / theirs:.2f}x SB3; "
              f"{ours / limit:.3f} and {theirs / limit:.3f} of the env limit", flush=True)
    print(f"wrote {save('atari', result)}")


if __name__ == "__main__":
    main()
