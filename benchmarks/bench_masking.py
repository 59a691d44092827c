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

import argparse
import time

import gymnasium as gym
from common import isolated, machine, median, save, sb3_time_to, shoal_time_to

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
    import shoal

    with shoal.make(shoal_config(0, 10 * steps, eval_interval=0)) as algo:
        algo.train()  # the first iteration: imports, first Adam step
        start, first = time.perf_counter(), algo.env_steps
        while algo.env_steps - first < steps:
            algo.train()
        return (algo.env_steps - first) / (time.perf_counter() - start)


def sb3_throughput(steps: int) -> float:
    model = sb3_model(0)
    model.learn(1024)  # the first iteration
    start, first = time.perf_counter(), model.num_timesteps
    model.learn(steps, reset_num_timesteps=False)
    return (model.num_timesteps - first) / (time.perf_counter() - start)


def shoal_time(seed: int):
    return shoal_time_to(shoal_config(seed, BUDGET, stop_return=TARGET, eval_interval=EVAL_EVERY,
                                      eval_episodes=10), TARGET)


def sb3_time(seed: int):
    from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback

    return sb3_time_to(lambda: sb3_model(seed), ENV, TARGET, seed, EVAL_EVERY // 8, BUDGET,
                       eval_callback=MaskableEvalCallback)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_480, help="env steps of the throughput runs")
    parser.add_argument("--seeds", type=int, nargs="*", default=[], help=f"seeds of the time-to-{TARGET:.0f} runs")
    args = parser.parse_args()
    rate = {"shoal": isolated(shoal_throughput, args.steps), "sb3-contrib": isolated(sb3_throughput, args.steps)}
    print(f"machine: {machine()}")
    print(f"training env steps/s over {args.steps:,} steps: shoal {rate['shoal']:,.0f}, sb3-contrib "
          f"{rate['sb3-contrib']:,.0f}; ratio {rate['shoal'] / rate['sb3-contrib']:.2f}", flush=True)
    rows = []
    for seed in args.seeds:
        for name, fn in (("shoal", shoal_time), ("sb3-contrib", sb3_time)):
            reached = isolated(fn, seed)
            best = max((point[2] for point in reached.curve), default=float("nan"))
            ran_s = reached.curve[-1][1] if reached.curve else float("nan")
            rows.append({"framework": name, "seed": seed, "seconds": reached.seconds, "steps": reached.steps,
                         "best": best, "ran_s": ran_s, "curve": reached.curve})
            if reached.seconds == reached.seconds:
                print(f"{name:11s} seed {seed}: {reached.seconds:6.1f} s to {TARGET:.0f}, {reached.steps:7,d} steps",
                      flush=True)
            else:
                print(f"{name:11s} seed {seed}: not {TARGET:.0f} in {reached.steps:,d} steps ({ran_s:.1f} s; "
                      f"best {best:.1f})", flush=True)
    result = {"steps_per_s": rate, "throughput_ratio": rate["shoal"] / rate["sb3-contrib"], "rows": rows}
    if rows:
        med = {f: median([r["seconds"] if r["seconds"] == r["seconds"] else r["ran_s"]
                          for r in rows if r["framework"] == f]) for f in rate}
        missed = {f: sum(r["seconds"] != r["seconds"] for r in rows if r["framework"] == f) for f in rate}
        result["median_s"], result["time_ratio"] = med, med["shoal"] / med["sb3-contrib"]
        bound = "<= " if missed["sb3-contrib"] and not missed["shoal"] else ""
        print(f"median time to {TARGET:.0f} (a run that missed it counted at its whole time): shoal "
              f"{med['shoal']:.1f} s ({missed['shoal']} missed), sb3-contrib {med['sb3-contrib']:.1f} s "
              f"({missed['sb3-contrib']} missed); ratio {bound}{result['time_ratio']:.2f}")
    save("masking", result)


if __name__ == "__main__":
    main()
