"""Recurrent PPO on CartPoleNoVel-v1: shoal (``lstm_size``) vs sb3-contrib's RecurrentPPO, same settings.

CartPoleNoVel-v1 is CartPole-v1 with its two velocities set to 0 in the observation
(rl-baselines3-zoo's benchmark for recurrent policies; shoal registers it). Both frameworks use
rl-zoo's ppo_lstm settings for it, which are shoal's preset: 8 envs, 32 steps, batch 256,
20 epochs, lr and clip linear from 1e-3 and 0.2, gamma 0.98, GAE 0.8; a 64-unit LSTM for the
actor and another for the critic, then one ReLU layer of 64 in each. One torch thread each, each
run in a fresh process.

Two figures, as ratios of shoal to sb3-contrib measured in the same run:

1. training throughput: env steps per wall second over ``--steps`` steps of training (sampling
   and updates; no evaluation), after the first iteration;
2. with ``--seeds``, time to a mean evaluation return of 475 (10 deterministic episodes every
   2048 steps, on a 10-env vector env), within 150k steps.

    .venv/bin/python benchmarks/bench_recurrent.py [--steps 10240] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import time

from common import isolated, machine, median, save, sb3_time_to, shoal_time_to

ENV, TARGET, EVAL_EVERY, BUDGET = "CartPoleNoVel-v1", 475.0, 2048, 150_000


def shoal_config(seed: int, total_steps: int, **sets):
    from shoal.algos.ppo import PPOConfig
    from shoal.config import build

    return build(PPOConfig, "ppo", env=ENV, sets={"seed": seed, "total_steps": total_steps, "progress": False,
                                                  "tensorboard": False, **sets})


def sb3_model(seed: int):
    import shoal.pomdp  # noqa: F401  (registers CartPoleNoVel-v1)
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    linear = lambda v: (lambda remaining: remaining * v)  # noqa: E731  (rl-zoo's lin_ schedules)
    return RecurrentPPO(
        "MlpLstmPolicy", make_vec_env(ENV, n_envs=8, seed=seed), n_steps=32, batch_size=256, gae_lambda=0.8,
        gamma=0.98, n_epochs=20, ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2), seed=seed,
        device="cpu", policy_kwargs=dict(ortho_init=False, activation_fn=torch.nn.ReLU, lstm_hidden_size=64,
                                         enable_critic_lstm=True, net_arch=dict(pi=[64], vf=[64])))


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
    model.learn(256)  # the first iteration
    start, first = time.perf_counter(), model.num_timesteps
    model.learn(steps, reset_num_timesteps=False)
    return (model.num_timesteps - first) / (time.perf_counter() - start)


def shoal_time(seed: int):
    return shoal_time_to(shoal_config(seed, BUDGET, stop_return=TARGET, eval_interval=EVAL_EVERY), TARGET)


def sb3_time(seed: int):
    import shoal.pomdp  # noqa: F401

    return sb3_time_to(lambda: sb3_model(seed), ENV, TARGET, seed, EVAL_EVERY // 8, BUDGET)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_240, help="env steps of the throughput runs")
    parser.add_argument("--seeds", type=int, nargs="*", default=[], help="seeds of the time-to-475 runs")
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
            else:  # a time to the target is then more than the run's: the ratio below is an upper bound
                print(f"{name:11s} seed {seed}: not {TARGET:.0f} in {reached.steps:,d} steps ({ran_s:.1f} s; "
                      f"best {best:.0f})", flush=True)
    result = {"steps_per_s": rate, "throughput_ratio": rate["shoal"] / rate["sb3-contrib"], "rows": rows}
    if rows:
        # a run that did not reach the target counts as its whole time (so a ratio against it is at most this)
        med = {f: median([r["seconds"] if r["seconds"] == r["seconds"] else r["ran_s"]
                          for r in rows if r["framework"] == f]) for f in rate}
        missed = {f: sum(r["seconds"] != r["seconds"] for r in rows if r["framework"] == f) for f in rate}
        result["median_s"], result["time_ratio"] = med, med["shoal"] / med["sb3-contrib"]
        bound = "<= " if missed["sb3-contrib"] and not missed["shoal"] else ""
        print(f"median time to {TARGET:.0f} (a run that missed it counted at its whole time): shoal "
              f"{med['shoal']:.1f} s ({missed['shoal']} missed), sb3-contrib {med['sb3-contrib']:.1f} s "
              f"({missed['sb3-contrib']} missed); ratio {bound}{result['time_ratio']:.2f}")
    save("recurrent", result)


if __name__ == "__main__":
    main()
