"""Time to mean eval return 475 on CartPole-v1: shoal PPO vs stable-baselines3 PPO, same settings.

Both use rl-baselines3-zoo's CartPole hyperparameters (shoal's preset), one torch thread, and the
same evaluation: every 2048 env steps, 10 deterministic episodes on a 10-env vector env (SB3's
EvalCallback given a vector env plays them in parallel too), stopping at a mean of 475. Wall time
runs from before each framework builds anything to the end of the evaluation that reaches 475
(shoal: the `time/wall_s` of that row in eval.csv, counted from the start of `shoal.make`, so
start-up, sampling, learning, evaluation, logging and best-checkpoint writes are all in it;
SB3: from building the model until `learn` returns, which its stop callback makes right after
that evaluation). A run that does not reach 475 within the budget counts as not solved.

    .venv/bin/python benchmarks/bench_cartpole_vs_sb3.py [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from common import isolated, machine, median, save, shoal_time_to

EVAL_EVERY, EVAL_EPISODES, TARGET, BUDGET = 2048, 10, 475.0, 100_000


def run_shoal(seed: int) -> tuple[float, int, bool]:
    from shoal.algos.ppo import PPOConfig
    from shoal.config import build

    config = build(PPOConfig, "ppo", env="CartPole-v1", sets={
        "seed": seed, "total_steps": BUDGET, "stop_return": TARGET, "eval_interval": EVAL_EVERY,
        "eval_episodes": EVAL_EPISODES, "progress": False, "tensorboard": False})
    seconds, steps = shoal_time_to(config, TARGET)[:2]
    return seconds, steps, seconds == seconds  # NaN when not solved


def run_sb3(seed: int) -> tuple[float, int, bool]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    start = time.perf_counter()
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    eval_env = make_vec_env("CartPole-v1", n_envs=EVAL_EPISODES, seed=seed + 1_000_000)
    stop = StopTrainingOnRewardThreshold(reward_threshold=TARGET, verbose=0)
    callback = EvalCallback(eval_env, callback_on_new_best=stop, eval_freq=EVAL_EVERY // 8,
                            n_eval_episodes=EVAL_EPISODES, deterministic=True, verbose=0)
    linear = lambda v: (lambda remaining: remaining * v)  # noqa: E731  (rl-zoo's lin_ schedules)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2), seed=seed, device="cpu")
    model.learn(BUDGET, callback=callback)
    return time.perf_counter() - start, model.num_timesteps, callback.best_mean_reward >= TARGET


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        for name, fn in (("shoal", run_shoal), ("sb3", run_sb3)):
            seconds, steps, solved = isolated(fn, seed)  # each run in a fresh process
            rows.append({"framework": name, "seed": seed, "seconds": seconds, "steps": steps, "solved": solved})
            print(f"{name:6s} seed {seed}: {seconds:6.1f} s, {steps:7,d} steps, solved={solved}", flush=True)
    frameworks = ("shoal", "sb3")
    med = {f: median([r["seconds"] for r in rows if r["framework"] == f]) for f in frameworks}
    # Steps per wall second up to the solving evaluation (solved runs): speed apart from how many steps a seed needed.
    rate = {f: median([r["steps"] / r["seconds"] for r in rows if r["framework"] == f and r["solved"]])
            for f in frameworks}
    ratio = med["shoal"] / med["sb3"]
    print(f"\nmachine: {machine()}")
    print(f"median time to eval {TARGET:.0f} over {len(args.seeds)} seeds: shoal {med['shoal']:.1f} s, "
          f"SB3 {med['sb3']:.1f} s; ratio shoal/SB3 = {ratio:.2f} (target <= 0.5)")
    print(f"median env steps per wall second to that point: shoal {rate['shoal']:,.0f}, SB3 {rate['sb3']:,.0f}; "
          f"ratio {rate['shoal'] / rate['sb3']:.2f}")
    save("cartpole_vs_sb3", {"rows": rows, "median_s": med, "ratio": ratio, "steps_per_s": rate})


if __name__ == "__main__":
    main()
