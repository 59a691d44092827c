"""What `shoal tune` buys: a study of --trials trials, then the best trial's settings (best.yaml)
against the shipped preset, each trained to --target on --seeds in a fresh process.

The figures: the study's wall time and its trials' states, then for each seed the env steps and
wall seconds to the first evaluation at the target (the preset's evaluation interval for both),
and the ratios tuned/preset of their medians. The study's trials use seed 0, as `shoal tune`'s
default; seeds 1 and 2 are seeds the study never saw.

    .venv/bin/python benchmarks/bench_tune.py [--algo ppo] [--env CartPole-v1] [--trials 20]
        [--total-steps 20000] [--target 475] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from common import isolated, machine, median, save, shoal_time_to


def study(algo: str, env: str, trials: int, total_steps: int, where: str) -> dict:
    import shoal

    start = time.perf_counter()
    found = shoal.tune(algo, env, trials=trials, total_steps=total_steps, study_dir=where)
    states = [t["state"] for t in found.trials]
    return {"seconds": time.perf_counter() - start, "best_value": found.best_value, "best_params": found.best_params,
            **{state: states.count(state) for state in ("complete", "pruned", "fail")}}


def time_to(algo: str, env: str, settings: dict, seed: int, target: float) -> tuple[int, float]:
    import shoal

    config = shoal.make_config(algo, env, **settings, seed=seed, stop_return=target, total_steps=500_000,
                               progress=False, tensorboard=False)
    reached = shoal_time_to(config, target)
    return reached.steps, reached.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--total-steps", type=int, default=20_000)
    parser.add_argument("--target", type=float, default=475)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as where:
        found = isolated(study, args.algo, args.env, args.trials, args.total_steps, where + "/study")
    print(f"study: {args.trials} trials of {args.total_steps:,} steps in {found['seconds']:.0f} s "
          f"({found['complete']} complete, {found['pruned']} pruned, {found['fail']} failed); best "
          f"{found['best_value']}: {found['best_params']}", flush=True)
    rows = {"preset": [], "tuned": []}
    for seed in args.seeds:
        for name, settings in (("preset", {}), ("tuned", found["best_params"])):
            steps, seconds = isolated(time_to, args.algo, args.env, settings, seed, args.target)
            rows[name].append((steps, seconds))
            print(f"seed {seed} {name}: {args.target:g} at {steps:,} steps, {seconds:.1f} s", flush=True)
    medians = {name: (median([r[0] for r in runs]), median([r[1] for r in runs])) for name, runs in rows.items()}
    print(f"median steps tuned/preset {medians['tuned'][0] / medians['preset'][0]:.2f}, "
          f"median seconds tuned/preset {medians['tuned'][1] / medians['preset'][1]:.2f}")
    print(f"wrote {save('tune', {'study': found, 'runs': rows, 'args': vars(args)})}")


if __name__ == "__main__":
    main()
