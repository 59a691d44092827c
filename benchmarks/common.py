"""Helpers shared by the benchmark scripts: machine description and result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import NamedTuple

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
    """The median of times to a target, with NaN (a run that never reached it) counted as slower
    than any other; NaN for no runs."""
    return statistics.median(float("inf") if x != x else x for x in xs) if xs else float("nan")


def save(name: str, result: dict) -> Path:
    """Write a benchmark's figures to benchmarks/results/NAME.json (git-ignored)."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), "time": time.strftime("%Y-%m-%d %H:%M"), **result}, indent=2))
    return path


class Reached(NamedTuple):
    """A run to a target return: when it got there, and every evaluation on the way."""

    seconds: float
    """Wall time from the start to the end of the first evaluation at or above the target (NaN if none)."""
    steps: int
    """Env steps at that evaluation (the steps run, if none reached it)."""
    curve: list[tuple[int, float, float]]
    """(env steps, wall seconds, mean return) of each evaluation."""
    check: float = float("nan")
    """Mean return of the final policy on ``check_episodes`` deterministic episodes from other
    seeds than the evaluations' (NaN when not asked for)."""

    @classmethod
    def first(cls, curve: list[tuple[int, float, float]], target: float, steps_run: int,
              check: float = float("nan")) -> Reached:
        """The run's first evaluation at or above ``target`` in ``curve`` (NaN seconds and the
        ``steps_run`` if none)."""
        hit = next((point for point in curve if point[2] >= target), None)
        if hit is None:
            return cls(float("nan"), steps_run, curve, check)
        return cls(hit[1], hit[0], curve, check)


CHECK_SEED_OFFSET = 2_000_000  # the check's episodes start from seeds no evaluation used


def shoal_time_to(config, target: float, check_episodes: int = 0) -> Reached:
    """Train ``config`` (with stop_return set) in a scratch directory, to the first evaluation
    that reaches ``target``; then, untimed, play the final policy for ``check_episodes``."""
    import csv
    import tempfile

    import shoal
    from shoal.envs import EnvOptions, make_vector_env
    from shoal.evaluator import run_episodes

    with tempfile.TemporaryDirectory() as d:
        summary = shoal.train(config, run_dir=d)
        with open(Path(d) / "eval.csv", newline="") as f:
            curve = [(int(r["env_steps"]), float(r["time/wall_s"]), float(r["eval/return_mean"]))
                     for r in csv.DictReader(f)]
        check = float("nan")
        if check_episodes:
            policy = shoal.load_policy(d)  # the newest checkpoint: the run's final weights
            check = run_episodes(policy.module, make_vector_env(config.env, check_episodes, config.env_kwargs,
                                                                EnvOptions.of(config)), True,
                                 config.seed + CHECK_SEED_OFFSET, max_steps=100_000)["eval/return_mean"]
    return Reached.first(curve, target, summary["env_steps"], check)


def sb3_time_to(build, env_id: str, target: float, seed: int, eval_every: int, budget: int,
                check_episodes: int = 0, eval_callback=None, wrap=lambda envs: envs) -> Reached:
    """Train the stable-baselines3 model ``build()`` makes for up to ``budget`` env steps, with the
    evaluation shoal's runs make (every ``eval_every`` steps, 10 deterministic episodes on a 10-env
    vector env), stopping at the first evaluation that reaches ``target``. Time runs from building
    the model (and its evaluation env) to the end of each evaluation. Then, untimed, the final
    policy plays ``check_episodes``. ``eval_callback``: the evaluation's callback class (default
    EvalCallback; sb3-contrib's MaskableEvalCallback for masked models). ``wrap``: what the model's
    own vector env is wrapped in (VecFrameStack, say), given to the evaluation's too."""
    from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.env_util import make_vec_env

    curve: list[tuple[int, float, float]] = []

    class RecordAndStop(BaseCallback):  # EvalCallback calls it after each evaluation; False stops learn()
        def _on_step(self) -> bool:
            curve.append((self.num_timesteps, time.perf_counter() - start, float(self.parent.last_mean_reward)))
            return curve[-1][2] < target

    start = time.perf_counter()
    eval_env = wrap(make_vec_env(env_id, n_envs=10, seed=seed + 1_000_000))
    callback = (eval_callback or EvalCallback)(eval_env, callback_after_eval=RecordAndStop(), eval_freq=eval_every, n_eval_episodes=10,
                            deterministic=True, verbose=0)
    model = build()
    model.learn(budget, callback=callback)
    check = float("nan")
    if check_episodes:
        check_env = wrap(make_vec_env(env_id, n_envs=min(check_episodes, 10), seed=seed + CHECK_SEED_OFFSET))
        check = float(evaluate_policy(model, check_env, n_eval_episodes=check_episodes, deterministic=True)[0])
    return Reached.first(curve, target, model.num_timesteps, check)


def plot_curves(name: str, title: str, runs: list[tuple[str, int, list[tuple[int, float, float]]]], target: float,
                time_target: float | None = None) -> Path:
    """Write benchmarks/results/NAME.png: mean evaluation return against env steps and against
    wall time, one line per (framework, seed, (steps, seconds, return) points) in ``runs``."""
    from shoal.plot import save_figure, steps_and_time_axes

    fig, axes = steps_and_time_axes("mean evaluation return")
    frameworks = list(dict.fromkeys(run[0] for run in runs))
    seeds = list(dict.fromkeys(run[1] for run in runs))
    for framework, seed, curve in runs:
        steps, seconds, returns = zip(*curve) if curve else ((), (), ())
        style = {"color": f"C{frameworks.index(framework)}", "ls": ("-", "--", ":", "-.")[seeds.index(seed) % 4]}
        for ax, x in zip(axes, (steps, seconds)):
            ax.plot(x, returns, marker="o", ms=3, label=f"{framework}, seed {seed}", **style)
    for ax in axes:
        ax.axhline(target, color="grey", lw=0.8)
    if time_target is not None:
        axes[1].axvline(time_target, color="grey", lw=0.8, ls="--")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    RESULTS.mkdir(exist_ok=True)
    return save_figure(fig, RESULTS / f"{name}.png", dpi=100)


def normalized(envs):
    """A stable-baselines3 vector env with its observations normalised (VecNormalize without its
    reward half): what shoal's --normalize-obs does, for a peer's side of a benchmark."""
    from stable_baselines3.common.vec_env import VecNormalize

    return VecNormalize(envs, norm_obs=True, norm_reward=False)


def shoal_steps_per_s(config, steps: int, warmup: int = 0) -> float:
    """Env steps per wall second of shoal training ``config`` (sampling and updates, no
    evaluation) over ``steps`` steps, after its first iteration (imports, the first Adam step)
    and at least ``warmup`` env steps (random ones before learning starts, say)."""
    import shoal

    with shoal.make(config) as algo:
        algo.train()
        while algo.env_steps < warmup:
            algo.train()
        start, first = time.perf_counter(), algo.env_steps
        while algo.env_steps - first < steps:
            algo.train()
        return (algo.env_steps - first) / (time.perf_counter() - start)


def sb3_steps_per_s(model, steps: int, warmup: int) -> float:
    """Env steps per wall second of a stable-baselines3 ``model`` learning ``steps`` steps, after
    ``warmup`` steps (its first iteration)."""
    model.learn(warmup)
    start, first = time.perf_counter(), model.num_timesteps
    model.learn(steps, reset_num_timesteps=False)
    return (model.num_timesteps - first) / (time.perf_counter() - start)


def compare_times_to(runs: dict, seeds: list[int], target: float, rate: dict[str, float]) -> dict:
    """Run each framework's ``runs[name](seed)`` (a Reached; each in a fresh process) for every
    seed, print each time to ``target`` and the medians, and return the figures with the
    frameworks' training rates ``rate``. A run that missed the target counts at its whole time,
    so a ratio against it is an upper bound."""
    rows = []
    for seed in seeds:
        for name, fn in runs.items():
            reached = isolated(fn, seed)
            best = max((point[2] for point in reached.curve), default=float("nan"))
            ran_s = reached.curve[-1][1] if reached.curve else float("nan")
            rows.append({"framework": name, "seed": seed, "seconds": reached.seconds, "steps": reached.steps,
                         "best": best, "ran_s": ran_s, "curve": reached.curve})
            if reached.seconds == reached.seconds:
                print(f"{name:11s} seed {seed}: {reached.seconds:6.1f} s to {target:g}, {reached.steps:7,d} steps",
                      flush=True)
            else:
                print(f"{name:11s} seed {seed}: not {target:g} in {reached.steps:,d} steps ({ran_s:.1f} s; "
                      f"best {best:.1f})", flush=True)
    ours, peer = rate
    result = {"steps_per_s": rate, "throughput_ratio": rate[ours] / rate[peer], "rows": rows}
    if rows:
        med = {f: median([r["seconds"] if r["seconds"] == r["seconds"] else r["ran_s"]
                          for r in rows if r["framework"] == f]) for f in rate}
        missed = {f: sum(r["seconds"] != r["seconds"] for r in rows if r["framework"] == f) for f in rate}
        result["median_s"], result["time_ratio"] = med, med[ours] / med[peer]
        bound = "<= " if missed[peer] and not missed[ours] else ""
        print(f"median time to {target:g} (a run that missed it counted at its whole time): {ours} "
              f"{med[ours]:.1f} s ({missed[ours]} missed), {peer} {med[peer]:.1f} s ({missed[peer]} missed); "
              f"ratio {bound}{result['time_ratio']:.2f}")
    return result


def main_against_peer(name: str, description: str, default_steps: int, target: float, throughput: dict,
                      times: dict, argv: list[str] | None = None) -> None:
    """A benchmark script's main: parse ``--steps`` and ``--seeds`` (of ``argv``, default the
    command line's); print each framework's training rate (``throughput[framework](steps)``) and
    their ratio, then the times to ``target`` (``times[framework](seed)``,
    :func:`compare_times_to`); save the figures as NAME. The first framework is shoal, the
    second its peer."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=default_steps, help="env steps of the throughput runs")
    parser.add_argument("--seeds", type=int, nargs="*", default=[], help=f"seeds of the time-to-{target:g} runs")
    args = parser.parse_args(argv)
    rate = {framework: isolated(fn, args.steps) for framework, fn in throughput.items()}
    (ours, mine), (peer, theirs) = rate.items()
    print(f"machine: {machine()}")
    print(f"training env steps/s over {args.steps:,} steps: {ours} {mine:,.0f}, {peer} {theirs:,.0f}; "
          f"ratio {mine / theirs:.2f}", flush=True)
    save(name, compare_times_to(times, args.seeds, target, rate))
