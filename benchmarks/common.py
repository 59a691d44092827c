"""Helpers shared by the benchmark scripts: machine description and result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def machine() -> str:
    """One line naming the machine the figures come from."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, Python {platform.python_version()}"


def isolated(fn, *args):
    """``fn(*args)`` in a fresh Python process (spawned), its result returned. Each framework's
    figures come from a process of its own: no thread pool, allocator or floating-point mode
    (shoal flushes denormals; SB3 does not) carried from the other's run. ``fn`` must be a
    module-level function of a script in this folder."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def save(name: str, result: dict) -> Path:
    """Write a benchmark's figures to benchmarks/results/NAME.json (git-ignored)."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), "time": time.strftime("%Y-%m-%d %H:%M"), **result}, indent=2))
    return path


def shoal_time_to(config, target: float) -> tuple[float, int]:
    """Train ``config`` (with stop_return set) in a scratch directory; return the wall time and
    env steps of the first evaluation that reached ``target`` (NaN and the steps run if none)."""
    import csv
    import tempfile

    import shoal

    with tempfile.TemporaryDirectory() as d:
        summary = shoal.train(config, run_dir=d)
        if not summary["solved"]:
            return float("nan"), summary["env_steps"]
        with open(Path(d) / "eval.csv", newline="") as f:
            row = next(r for r in csv.DictReader(f) if float(r["eval/return_mean"]) >= target)
        return float(row["time/wall_s"]), int(row["env_steps"])


def sb3_time_to(build, env_id: str, target: float, seed: int, eval_every: int, budget: int) -> tuple[float, int]:
    """Train the stable-baselines3 model ``build()`` makes for up to ``budget`` env steps, with the
    evaluation shoal's runs make (every ``eval_every`` steps, 10 deterministic episodes on a 10-env
    vector env) and stopping at ``target``; return the wall time from building the model to the
    end of the evaluation that reached it (NaN if none did) and the env steps run."""
    from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold
    from stable_baselines3.common.env_util import make_vec_env

    start = time.perf_counter()
    eval_env = make_vec_env(env_id, n_envs=10, seed=seed + 1_000_000)
    stop = StopTrainingOnRewardThreshold(reward_threshold=target, verbose=0)
    callback = EvalCallback(eval_env, callback_on_new_best=stop, eval_freq=eval_every, n_eval_episodes=10,
                            deterministic=True, verbose=0)
    model = build()
    model.learn(budget, callback=callback)
    solved = callback.best_mean_reward >= target
    return (time.perf_counter() - start if solved else float("nan")), model.num_timesteps
