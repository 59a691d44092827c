"""The design documents' headline against a peer: SAC on LunarLanderContinuous-v3 to a mean
evaluation return of 200, shoal against stable-baselines3, as a ratio measured in one run.

Both sides use rl-baselines3-zoo's LunarLanderContinuous SAC settings (shoal's shipped preset):
400-300 networks, batch 256, lr 7.3e-4, tau 0.01, gamma 0.99, a 1M buffer, 10k steps of random
actions, one update per env step, automatic entropy tuning. Evaluation is the same: every
--eval-every steps, 10 deterministic episodes on a 10-env vector env, stopping at 200. Time runs
from building the algorithm to the end of the evaluation that reaches 200 (shoal: `time/wall_s`
in eval.csv; SB3: until `learn` returns). Each run is a fresh process of its own, one at a time.

    .venv/bin/python benchmarks/bench_lunar_sac.py [--seeds 0 1 2] [--threads 2] [--max-steps 150000]

A seed takes shoal 4-10 minutes here; SB3 runs longer.
"""

from __future__ import annotations

import argparse

import torch

from common import isolated, machine, median, save, sb3_time_to, shoal_time_to

ENV, TARGET = "LunarLanderContinuous-v3", 200.0


def shoal_time(seed: int, eval_every: int, max_steps: int, threads: int) -> tuple[float, int]:
    import shoal

    return shoal_time_to(shoal.make_config(
        "sac", ENV, seed=seed, stop_return=TARGET, eval_interval=eval_every, eval_episodes=10, total_steps=max_steps,
        progress=False, tensorboard=False, torch_threads=threads), TARGET)


def sb3_time(seed: int, eval_every: int, max_steps: int, threads: int) -> tuple[float, int]:
    from stable_baselines3 import SAC

    torch.set_num_threads(threads)
    return sb3_time_to(lambda: SAC("MlpPolicy", ENV, learning_rate=7.3e-4, buffer_size=1_000_000, batch_size=256,
                                   ent_coef="auto", gamma=0.99, tau=0.01, train_freq=1, gradient_steps=1,
                                   learning_starts=10_000, policy_kwargs={"net_arch": [400, 300]}, seed=seed,
                                   device="cpu"),
                       ENV, TARGET, seed, eval_every, max_steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--max-steps", type=int, default=150_000, help="give up on a run after this many env steps")
    args = parser.parse_args()
    print(f"machine: {machine()}; torch threads: {args.threads}", flush=True)
    rows = []
    for seed in args.seeds:
        s_t, s_n = isolated(shoal_time, seed, args.eval_every, args.max_steps, args.threads)
        print(f"seed {seed}: shoal {s_t:6.1f} s ({s_n:,} steps)", flush=True)
        b_t, b_n = isolated(sb3_time, seed, args.eval_every, args.max_steps, args.threads)
        print(f"seed {seed}: SB3   {b_t:6.1f} s ({b_n:,} steps)", flush=True)
        rows.append((s_t, s_n, b_t, b_n))
    s_med, b_med = median([r[0] for r in rows]), median([r[2] for r in rows])
    print(f"median time to {TARGET:g}: shoal {s_med:.1f} s, SB3 {b_med:.1f} s; ratio {s_med / b_med:.2f}; "
          f"target: shoal <= 360 s (NaN: not reached within --max-steps)")
    save("lunar_sac", {"threads": args.threads, "eval_every": args.eval_every, "rows": rows,
                       "shoal_median_s": s_med, "sb3_median_s": b_med, "ratio": s_med / b_med})


if __name__ == "__main__":
    main()
