"""The design documents' headline against a peer: SAC on LunarLanderContinuous-v3 to a mean
evaluation return of 200, shoal against stable-baselines3, as a ratio measured in one run.

Both sides use rl-baselines3-zoo's LunarLanderContinuous SAC settings (shoal's shipped preset):
400-300 networks, batch 256, lr 7.3e-4, tau 0.01, gamma 0.99, a 1M buffer, 10k steps of random
actions, one update per env step, automatic entropy tuning. Evaluation is the same: every
--eval-every steps, 10 deterministic episodes on a 10-env vector env, stopping at 200. Time runs
from building the algorithm to the end of the evaluation that reaches 200 (shoal: `time/wall_s`
in eval.csv; SB3: a callback after each evaluation). Each run is a fresh process of its own, one
at a time. A run stops on one 10-episode sample (shoal's evaluations start from the same seeds
each time, SB3's from new ones), so after the stop each final policy also plays --check-episodes
deterministic episodes from seeds no evaluation used (untimed): how well it does on starts it was
not picked on. Every evaluation of every run goes
into benchmarks/results/lunar_sac.json, the curves into benchmarks/results/lunar_sac.png.

With ``--algo crossq``, shoal's CrossQ preset against sb3-contrib's CrossQ with the same settings
(rl-zoo's: sb3-contrib's defaults, lr 1e-3, policy delay 3, Adam's beta1 0.5, Batch
Renormalization's momentum 0.01 and 100k warm-up passes, 10k random steps), 256-wide actor and
critics on both (shoal's preset; rl-zoo's 1024-wide critics update 5x as slowly on these CPUs)
and the preset's updates per env step on both (0.5: SB3's ``train_freq=2``; rl-zoo's is 1);
the results go to lunar_crossq.json and .png. With ``--algo tqc``, shoal's TQC preset against
sb3-contrib's TQC with the same settings (rl-zoo's: SAC's above, with a linear learning-rate decay
over 500k steps; 2 critics of 25 quantiles, 2 dropped per critic); lunar_tqc.json and .png. The
decay runs over the preset's 500k steps on both sides, so shoal's run keeps total_steps 500k and
stops at --max-time-s instead of --max-steps.

With ``--distributed N``, each seed also trains on the ray backend, the issue's distributed layout:
``--apex`` with N runners inserting into the replay actor and the learner sampling it, one torch
thread per role (`shoal train ALGO --env LunarLanderContinuous-v3 --backend ray --apex
--num-env-runners N --torch-threads 1`). Its time (from building the algorithm, so Ray's start-up
is in it) is set against the single-process run's of the same seed, measured in the same run.
``--skip-peer`` times shoal's layouts alone.

    .venv/bin/python benchmarks/bench_lunar_sac.py [--algo sac|crossq|tqc] [--seeds 0 1 2] [--threads 2]
        [--max-steps 150000] [--check-episodes 100] [--distributed 2] [--skip-peer]

A seed takes shoal 4-10 minutes here; SB3 runs longer.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from common import Reached, isolated, machine, median, plot_curves, save, sb3_time_to, shoal_time_to

ENV, TARGET = "LunarLanderContinuous-v3", 200.0
TITLES = {"sac": "SAC", "crossq": "CrossQ", "tqc": "TQC"}


def shoal_time(algo: str, seed: int, eval_every: int, max_steps: int, threads: int, check_episodes: int,
               max_time_s: float, runners: int = 0) -> Reached:
    """Time to 200 in one process, or with ``runners`` > 0 on the ray backend under --apex (a torch
    thread per role: the learner shares the cores with the runners and the replay)."""
    import shoal

    layout = {"backend": "ray", "apex": True, "num_env_runners": runners, "torch_threads": 1} if runners else {
        "torch_threads": threads}
    config = shoal.make_config(algo, ENV, seed=seed, stop_return=TARGET, eval_interval=eval_every, eval_episodes=10,
                               progress=False, tensorboard=False, **layout)
    # a learning rate decayed over the preset's total_steps keeps them: the run stops at a time instead
    cap = {"stop_time_s": max_time_s} if config.lr_schedule == "linear" else {"total_steps": max_steps}
    return shoal_time_to(dataclasses.replace(config, **cap), TARGET, check_episodes)


def sb3_time(algo: str, seed: int, eval_every: int, max_steps: int, threads: int, check_episodes: int) -> Reached:
    from stable_baselines3 import SAC

    torch.set_num_threads(threads)
    if algo == "crossq":
        from sb3_contrib import CrossQ

        # train_freq=2: one update per 2 env steps, as shoal's preset (updates_per_step 0.5)
        return sb3_time_to(lambda: CrossQ("MlpPolicy", ENV, learning_rate=1e-3, buffer_size=1_000_000, batch_size=256,
                                          gamma=0.99, learning_starts=10_000, policy_delay=3, seed=seed, device="cpu",
                                          train_freq=2,
                                          policy_kwargs={"net_arch": {"pi": [256, 256], "qf": [256, 256]}}),
                           ENV, TARGET, seed, eval_every, max_steps, check_episodes)
    model_cls, lr = SAC, 7.3e-4  # rl-zoo's SAC settings; its TQC's are the same but for a decaying lr
    if algo == "tqc":
        from sb3_contrib import TQC

        # rl-zoo's lin_7.3e-4 over its 500k steps (progress_remaining runs over learn's max_steps)
        model_cls, lr = TQC, lambda progress_remaining: 7.3e-4 * (1 - (1 - progress_remaining) * max_steps / 500_000)
    return sb3_time_to(lambda: model_cls("MlpPolicy", ENV, learning_rate=lr, buffer_size=1_000_000, batch_size=256,
                                         ent_coef="auto", gamma=0.99, tau=0.01, train_freq=1, gradient_steps=1,
                                         learning_starts=10_000, policy_kwargs={"net_arch": [400, 300]}, seed=seed,
                                         device="cpu"),
                       ENV, TARGET, seed, eval_every, max_steps, check_episodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=list(TITLES), default="sac")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--max-steps", type=int, default=150_000, help="give up on a run after this many env steps")
    parser.add_argument("--max-time-s", type=float, default=1200,
                        help="stop a shoal run whose learning rate decays over the preset's steps after this long")
    parser.add_argument("--check-episodes", type=int, default=100,
                        help="episodes from unseen seeds each final policy plays after its run (0: none)")
    parser.add_argument("--distributed", type=int, default=0, metavar="N",
                        help="also train each seed on the ray backend with --apex and N runners")
    parser.add_argument("--skip-peer", action="store_true", help="time shoal's layouts only, not the peer's")
    args = parser.parse_args()
    print(f"machine: {machine()}; torch threads: {args.threads}", flush=True)
    rows, runs = [], []
    for seed in args.seeds:
        ours = isolated(shoal_time, args.algo, seed, args.eval_every, args.max_steps, args.threads, args.check_episodes,
                        args.max_time_s)
        print(f"seed {seed}: shoal {describe(ours)}", flush=True)
        row = {"seed": seed, "shoal_s": ours.seconds, "shoal_steps": ours.steps, "shoal_check": ours.check}
        runs.append(("shoal", seed, ours.curve))
        if args.distributed:
            spread = isolated(shoal_time, args.algo, seed, args.eval_every, args.max_steps, args.threads,
                              args.check_episodes, args.max_time_s, args.distributed)
            print(f"seed {seed}: shoal on Ray, --apex, {args.distributed} runners {describe(spread)}", flush=True)
            row.update(ray_s=spread.seconds, ray_steps=spread.steps, ray_check=spread.check)
            runs.append((f"shoal, ray --apex {args.distributed} runners", seed, spread.curve))
        if not args.skip_peer:
            theirs = isolated(sb3_time, args.algo, seed, args.eval_every, args.max_steps, args.threads,
                              args.check_episodes)
            print(f"seed {seed}: SB3   {describe(theirs)}", flush=True)
            row.update(sb3_s=theirs.seconds, sb3_steps=theirs.steps, sb3_check=theirs.check)
            runs.append(("stable-baselines3" if args.algo == "sac" else "sb3-contrib", seed, theirs.curve))
        rows.append(row)
    s_med = median([r["shoal_s"] for r in rows])
    b_med = median([r["sb3_s"] for r in rows if "sb3_s" in r])
    r_med = median([r["ray_s"] for r in rows if "ray_s" in r])
    print(f"median time to {TARGET:g}: shoal {s_med:.1f} s"
          + (f", SB3 {b_med:.1f} s; ratio {s_med / b_med:.2f}" if not args.skip_peer else "")
          + (f"; on Ray with {args.distributed} runners {r_med:.1f} s, {r_med / s_med:.2f} of one process"
             if args.distributed else "")
          + "; target: shoal <= 360 s (nan: not reached within --max-steps; a median counts it as slower than any run)")
    name, title = f"lunar_{args.algo}", TITLES[args.algo]
    save(name, {"algo": args.algo, "threads": args.threads, "eval_every": args.eval_every,
                "check_episodes": args.check_episodes, "distributed": args.distributed, "rows": rows,
                "shoal_median_s": s_med, "sb3_median_s": b_med, "ratio": s_med / b_med,
                "ray_median_s": r_med, "ray_ratio": r_med / s_med,
                "curves": [{"framework": f, "seed": seed, "steps_seconds_return": c} for f, seed, c in runs]})
    print("curves:", plot_curves(name, f"{title} on {ENV}, mean return of 10 deterministic episodes", runs,
                                 TARGET, time_target=360))


def describe(run: Reached) -> str:
    """The time to the target, each evaluation's mean return (with the wall second it ended) and the check."""
    return (f"{run.seconds:6.1f} s ({run.steps:,} steps); evaluations "
            + ", ".join(f"{ret:.0f} ({sec:.0f} s)" for _, sec, ret in run.curve)
            + f"; final policy on unseen seeds {run.check:.1f}")


if __name__ == "__main__":
    main()
