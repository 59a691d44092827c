"""Soak: ray-backend PPO training with a runner actor killed every --kill-every seconds.

Reports runner restarts, dropped episodes, env steps/s in the --window seconds before and after
each kill (ratio after/before: the limit is 1.0, an undisturbed run), and the resident memory of
the driver plus every Ray worker process over time (growth from the first sample after warm-up
to the last; target: no growth beyond 10%).

    .venv/bin/python benchmarks/soak_faults.py [--minutes 30] [--kill-every 60] [--runners 2]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import numpy as np

from common import machine, save


def rss_mib() -> float:
    """Resident memory of this process and every Ray process on the machine, MiB (Linux /proc)."""
    total_kib = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if int(entry.name) != os.getpid() and not any(k in cmd for k in ("ray::", "raylet", "gcs_server")):
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        except (OSError, ValueError):
            continue  # the process ended meanwhile
    return total_kib / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--kill-every", type=float, default=60.0)
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument("--window", type=float, default=10.0)
    args = parser.parse_args()
    import ray

    import shoal
    from shoal.algos.ppo import PPOConfig
    from shoal.config import build

    config = build(PPOConfig, "ppo", env="CartPole-v1", sets={
        "backend": "ray", "num_env_runners": args.runners, "total_steps": 10**12, "progress": False,
        "tensorboard": False})
    steps_log: list[tuple[float, int]] = []  # (time, env steps) after every iteration
    memory: list[tuple[float, float]] = []
    kills: list[float] = []
    with shoal.make(config) as algo:
        start = time.monotonic()
        end = start + args.minutes * 60
        next_kill = start + args.kill_every
        next_mem = start
        victim = 0
        while time.monotonic() < end:
            algo.train()
            now = time.monotonic()
            steps_log.append((now - start, algo.env_steps))
            if now >= next_mem:
                memory.append((now - start, rss_mib()))
                next_mem = now + 10.0
            if now >= next_kill:  # kill a runner from another thread, while the next iteration samples
                handle = algo.runners[victim]
                threading.Timer(0.01, lambda h=handle: ray.kill(h.actor)).start()
                kills.append(time.monotonic() - start)
                victim = (victim + 1) % args.runners
                next_kill += args.kill_every
        faults = algo.fault_metrics()
    t = np.array([x for x, _ in steps_log])
    n = np.array([y for _, y in steps_log], dtype=float)

    def rate(lo: float, hi: float) -> float:
        sel = (t >= lo) & (t <= hi)
        if sel.sum() < 2:
            return float("nan")
        return float((n[sel][-1] - n[sel][0]) / (t[sel][-1] - t[sel][0]))

    ratios = [rate(k + 1.0, k + 1.0 + args.window) / rate(k - args.window, k) for k in kills]
    warm = [m for x, m in memory if x >= 60.0] or [m for _, m in memory]
    growth = (warm[-1] - warm[0]) / warm[0]
    print(f"machine: {machine()}; {args.runners} runners, {args.minutes:g} min, a runner killed every "
          f"{args.kill_every:g} s")
    print(f"kills: {len(kills)}; runner restarts: {faults['faults/runner_restarts']:.0f}; dropped episodes: "
          f"{faults['faults/dropped_episodes']:.0f}; env steps: {int(n[-1]):,} ({n[-1] / t[-1]:,.0f}/s overall)")
    print(f"env steps/s after/before each kill ({args.window:g} s windows): median {np.nanmedian(ratios):.2f}, "
          f"min {np.nanmin(ratios):.2f} (limit 1.0)")
    print(f"memory (driver + Ray processes): {warm[0]:,.0f} MiB after warm-up, {warm[-1]:,.0f} MiB at the end, "
          f"max {max(warm):,.0f} MiB; growth {growth:+.1%} (target <= +10%)")
    save("soak_faults", {"minutes": args.minutes, "kill_every": args.kill_every, "kills": len(kills),
                         "faults": faults, "env_steps": int(n[-1]), "rate_ratios": ratios,
                         "memory_mib": memory, "memory_growth": growth})


if __name__ == "__main__":
    main()
