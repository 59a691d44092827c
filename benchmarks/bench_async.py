"""APPO's asynchronous loop against PPO's synchronous loop on the ray backend, same runners.

Both run on CartPole-v1 with their shipped presets (8 envs x 32 steps per rollout) and the same
runners (--runners, default 2), in one process each, one after the other:

1. Throughput: env steps per second of training (sampling and learning; evaluation excluded) over
   --steps env steps after a warm-up iteration. PPO's runners wait while its learner runs 20
   epochs; APPO's keep sampling while its learner runs 2 epochs on queued rollouts. A third row
   gives APPO PPO's 20 epochs, to separate the loop's gain from the lighter learner work.
2. Time to a mean eval return of 475 (wall time from `shoal.make`, start-up included; evaluation
   every 4096 steps, 10 deterministic episodes), per seed.
3. APPO's policy lag (mean and max, in versions) and learner queue depth, beside them.

    .venv/bin/python benchmarks/bench_async.py [--seeds 0 1 2] [--runners 2] [--steps 60000]
"""

from __future__ import annotations

import argparse
import time

from common import machine, median, save, shoal_time_to

TARGET = 475.0


def config_for(algo: str, runners: int, seed: int, **sets):
    import shoal

    return shoal.make_config(algo, "CartPole-v1", backend="ray", num_env_runners=runners, seed=seed,
                             progress=False, tensorboard=False, **sets)


def throughput(algo: str, runners: int, steps: int, **sets) -> dict[str, float]:
    """Env steps per second of train() calls, after one warm-up iteration; lag figures."""
    import shoal

    with shoal.make(config_for(algo, runners, 0, total_steps=10**9, **sets)) as a:
        a.train()
        start_steps, start = a.env_steps, time.perf_counter()
        lags, lag_max, depths = [], 0.0, []
        while a.env_steps - start_steps < steps:
            m = a.train()
            lags.append(m["learner/policy_lag_mean"])
            lag_max = max(lag_max, m["learner/policy_lag_max"])
            depths.append(m.get("learner/queue_depth", 0.0))
        rate = (a.env_steps - start_steps) / (time.perf_counter() - start)
    return {"steps_per_s": rate, "lag_mean": sum(lags) / len(lags), "lag_max": lag_max,
            "queue_depth": sum(depths) / len(depths)}


def time_to_target(algo: str, runners: int, seed: int) -> tuple[float, int]:
    return shoal_time_to(config_for(algo, runners, seed, stop_return=TARGET, eval_interval=4096, eval_episodes=10),
                         TARGET)[:2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60_000)
    args = parser.parse_args()
    print(f"machine: {machine()}; {args.runners} runners x 8 envs, ray backend")
    result: dict = {"runners": args.runners}
    rates = {algo: throughput(algo, args.runners, args.steps) for algo in ("ppo", "appo")}
    # The loop's own share: APPO doing PPO's learner work (20 epochs of 256-sample minibatches).
    rates["appo_20_epochs"] = throughput("appo", args.runners, args.steps, num_epochs=20)
    for algo, r in rates.items():
        print(f"{algo}: {r['steps_per_s']:,.0f} env steps/s; policy lag mean {r['lag_mean']:.2f}, "
              f"max {r['lag_max']:.0f}; queue depth {r['queue_depth']:.2f}")
    ratio = rates["appo"]["steps_per_s"] / rates["ppo"]["steps_per_s"]
    same = rates["appo_20_epochs"]["steps_per_s"] / rates["ppo"]["steps_per_s"]
    print(f"throughput: APPO async / PPO sync = {ratio:.2f} (target >= 1.5); "
          f"with PPO's 20 epochs per batch: {same:.2f}")
    result["throughput"] = {**rates, "ratio": ratio, "ratio_same_epochs": same}
    times: dict[str, list] = {"ppo": [], "appo": []}
    for seed in args.seeds:
        for algo in times:
            t, n = time_to_target(algo, args.runners, seed)
            times[algo].append((t, n))
            print(f"{algo} seed {seed}: {t:6.1f} s to {TARGET:g} ({n:,} steps)", flush=True)
    med = {algo: median([t for t, _ in rows]) for algo, rows in times.items()}
    print(f"time to {TARGET:g}, median: PPO {med['ppo']:.1f} s, APPO {med['appo']:.1f} s; "
          f"APPO / PPO = {med['appo'] / med['ppo']:.2f}")
    result["time_to_target"] = {**times, "ratio": med["appo"] / med["ppo"]}
    save("async_vs_sync", result)


if __name__ == "__main__":
    main()
