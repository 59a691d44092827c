"""Start-up: wall time from launching `shoal train` to the first environment step, local and ray.

The env is a CartPole that writes the time of its first step to a file (benchmarks/probe_env.py,
loaded with Gymnasium's `module:EnvId` form). Each figure is the median of --repeats launches,
against the floor of launching Python and importing torch and gymnasium in the same run.

    .venv/bin/python benchmarks/bench_startup.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine, median, save

HERE = Path(__file__).parent


def first_step_s(args: list[str]) -> float:
    with tempfile.TemporaryDirectory() as d:
        probe = Path(d) / "first_step"
        env = {**os.environ, "SHOAL_PROBE_FILE": str(probe),
               "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        start = time.time()
        proc = subprocess.run([sys.executable, "-m", "shoal.cli", *args, "--run-dir", f"{d}/run"],
                              env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 or not probe.exists():
            raise RuntimeError(proc.stderr[-2000:])
        return float(probe.read_text()) - start


def floor_s() -> float:
    start = time.time()
    subprocess.run([sys.executable, "-c", "import torch, gymnasium"], check=True)
    return time.time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    common = ["train", "ppo", "--env", "probe_env:StartupProbe-v0", "--total-steps", "256",
              "--no-progress", "--no-tensorboard"]
    floor = median([floor_s() for _ in range(args.repeats)])
    local = median([first_step_s(common) for _ in range(args.repeats)])
    ray = median([first_step_s(common + ["--backend", "ray", "--num-env-runners", "2"]) for _ in range(args.repeats)])
    print(f"machine: {machine()}")
    print(f"python + import torch, gymnasium (floor): {floor:5.2f} s")
    print(f"shoal train, local backend, to 1st step:  {local:5.2f} s  ({local / floor:.1f}x the floor)")
    print(f"shoal train, ray backend (2 runners):     {ray:5.2f} s  ({ray / floor:.1f}x the floor)")
    save("startup", {"floor_s": floor, "local_s": local, "ray_s": ray})


if __name__ == "__main__":
    main()
