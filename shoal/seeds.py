"""Runs of one configuration over several seeds: ``shoal train ... --seeds 0 1 2`` and
``shoal.train_seeds``. Each seed's run is a whole run in DIR/seed_N; DIR/seeds.yaml records the
algorithm, the seeds and their settings, so that ``shoal train --resume DIR`` (``resume_seeds``)
goes on with all of them; DIR/curves.png plots their mean (``shoal plot DIR --aggregate``)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import statistics
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from shoal.errors import ShoalError

SEEDS_FILE = "seeds.yaml"
"""In a directory of seeds' runs: the algorithm, the seeds and their settings."""

Report = Callable[[int, dict[str, Any], int], None]
"""Called as each seed's run ends: (seed, its summary, how many have ended)."""


BOOTSTRAP_SAMPLES = 10_000


def iqm(values: Any, axis: int = 0) -> Any:
    """The interquartile mean along ``axis`` (runs): the mean of the values left once a quarter of
    them (rounded down) is cut from each end, as rliable computes it (scipy's ``trim_mean(values,
    0.25)``). A number for a list of scores, an array for scores [runs, points]."""
    import numpy as np

    x = np.sort(np.asarray(values, np.float64), axis)
    n = x.shape[axis]
    middle = np.take(x, range(int(0.25 * n), n - int(0.25 * n)), axis).mean(axis)
    return float(middle) if middle.ndim == 0 else middle


def iqm_interval(values: Any, confidence: float = 0.95, seed: int = 0,
                 samples: int = BOOTSTRAP_SAMPLES) -> tuple[Any, Any, Any]:
    """The IQM of runs' scores and a percentile bootstrap interval of it over the runs (resampled
    with replacement, ``samples`` times): what Agarwal et al. (2021, "Deep RL at the edge of the
    statistical precipice") recommend reporting for a few runs, rather than a mean alone. Scores
    [runs] give numbers; scores [runs, points] (curves) give an array of each, one per point."""
    import numpy as np

    x = np.asarray(values, np.float64)
    picks = np.random.default_rng(seed).integers(0, len(x), (samples, len(x)))  # the same resamples at every point
    columns = x.reshape(len(x), -1)
    bounds = np.empty((2, columns.shape[1]))
    step = max(1, 4_000_000 // (samples * len(x)))  # points at a time: a long curve's resamples in bounded memory
    for at in range(0, columns.shape[1], step):
        bounds[:, at:at + step] = np.quantile(iqm(columns[picks, at:at + step], axis=1),  # [samples, runs, points]
                                              [(1 - confidence) / 2, (1 + confidence) / 2], axis=0)
    low, high = bounds.reshape(2, *x.shape[1:])
    return (iqm(x), float(low), float(high)) if x.ndim == 1 else (iqm(x), low, high)


def train_seeds(config: Any, seeds: list[int], run_dir: str | Path | None = None, n_jobs: int = 1,
                console: Console | None = None, report: Report | None = None,
                starting: Callable[[int, Path], None] | None = None) -> dict[str, Any]:
    """A run of ``config`` per seed in ``run_dir``/seed_N (default: config.run_dir, else
    runs/ALGO-ENV-TIME-seeds), one after another or ``n_jobs`` at once (each in a process of its
    own); returns :func:`run_seeds`' summary. More seeds into a directory of seeds join it, with
    the same settings only."""
    from shoal.algos import spec_for
    from shoal.config import SEED_LIMIT
    from shoal.rundir import RunDir

    seeds = list(seeds)
    if (not seeds or len(set(seeds)) != len(seeds)
            or not all(isinstance(s, int) and 0 <= s < SEED_LIMIT for s in seeds)):
        raise ShoalError(f"--seeds takes different seeds from 0 to {SEED_LIMIT - 1}, got "
                         f"{' '.join(map(str, seeds)) or 'none'}")
    name = spec_for(config).name
    parent = Path(run_dir or config.run_dir or RunDir.default_path(name, config.env, seeds[0], tag="seeds"))
    taken = [parent / f"seed_{s}" for s in seeds if (parent / f"seed_{s}" / "config.yaml").exists()]
    if taken:
        raise ShoalError(f"{taken[0]} already holds a run: choose another --run-dir for these seeds")
    check_jobs(n_jobs, config)
    _record(parent, name, config, seeds)
    return run_seeds(config, seeds, parent, n_jobs, console, report, starting)


def read_seeds(run_dir: str | Path) -> tuple[str, dict[str, Any], list[int]]:
    """(algorithm, settings, seeds) a directory of seeds' runs records."""
    from shoal.config import read_yaml

    record = read_yaml(Path(run_dir) / SEEDS_FILE)
    return record["algo"], dict(record["settings"]), [int(s) for s in record["seeds"]]


def is_seeds_dir(path: str | Path) -> bool:
    """Whether ``path`` holds seeds' runs that :func:`resume_seeds` can go on with."""
    return (Path(path) / SEEDS_FILE).is_file()


def resume_seeds(run_dir: str | Path, config: Any | None = None, n_jobs: int = 1, console: Console | None = None,
                 report: Report | None = None, starting: Callable[[int, Path], None] | None = None) -> dict[str, Any]:
    """Go on with a directory of seeds' runs: a run that began resumes from its newest checkpoint,
    one that never began starts, one with nothing left to train gives its summary as it ended.
    ``config`` (default: the recorded settings) may change what a resume may change (a larger
    total_steps, say); it is recorded as the seeds' settings, as a resumed run's config.yaml is."""
    from shoal.algorithm import config_from_dict

    name, settings, seeds = read_seeds(run_dir)
    config = config or config_from_dict(name, settings, str(Path(run_dir) / SEEDS_FILE))
    check_jobs(n_jobs, config)
    _record(Path(run_dir), name, config, seeds, resumed=True)
    return run_seeds(config, seeds, Path(run_dir), n_jobs, console, report, starting)


def check_jobs(jobs: int, config: Any) -> None:
    """``--n-jobs`` for seeds: at least 1, and 1 for runs on the ray backend."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ShoalError(f"--n-jobs must be at least 1, got {jobs}")
    if jobs > 1 and config.backend != "local":
        raise ShoalError("--n-jobs runs seeds in processes of this machine; runs on the ray backend share its "
                         "cluster one at a time (give --n-jobs 1)")


def _record(parent: Path, name: str, config: Any, seeds: list[int], resumed: bool = False) -> None:
    """Write (or add ``seeds`` to) ``parent``'s :data:`SEEDS_FILE`; another command's seeds of
    other settings in the same directory are refused, but for a resume of them (``resumed``),
    whose settings replace the ones recorded."""
    import yaml

    from shoal.config import read_yaml, to_dict
    from shoal.plot import NOT_SETTINGS
    from shoal.rundir import atomic_write_text

    settings = {k: v for k, v in to_dict(config).items() if k not in NOT_SETTINGS}
    record = parent / SEEDS_FILE
    if record.is_file():
        saved = read_yaml(record)
        if not resumed and (saved.get("algo") != name
                            or saved.get("settings") != yaml.safe_load(yaml.safe_dump(settings))):
            raise ShoalError(f"{parent} holds seeds of other settings ({record}): choose another --run-dir")
        seeds = [*saved["seeds"], *(s for s in seeds if s not in saved["seeds"])]
    parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(record, yaml.safe_dump({"algo": name, "seeds": seeds, "settings": settings}, sort_keys=False))


def seed_run(config: Any, run_dir: Path, console: Console | None = None, label: str | None = None) -> dict[str, Any]:
    """A seed's run of ``config``: trained afresh in ``run_dir``, resumed from its newest
    checkpoint there, or, where it has nothing left to do, its summary as it ended."""
    from shoal import trainer

    if not (run_dir / "config.yaml").is_file():
        return trainer.train(config, run_dir=run_dir, console=console, label=label)
    return trainer.finished_summary(run_dir, config) or trainer.resume(run_dir, config, console=console, label=label)


def run_seeds(config: Any, seeds: list[int], parent: Path, jobs: int = 1, console: Console | None = None,
              report: Report | None = None, starting: Callable[[int, Path], None] | None = None) -> dict[str, Any]:
    """The seeds' runs of ``config`` in ``parent``/seed_N (new, resumed, or done already), one after
    another or ``jobs`` at once (``starting(seed, run_dir)`` as each begins); then a plot of their
    mean in ``parent``/curves.png. Returns the runs' summaries (``runs``, in seed order) and their
    final evaluations' mean and std over the seeds."""
    from shoal.plot import plot_aggregate
    from shoal.tracking import grouped
    from shoal.trainer import Interrupted

    config = grouped(config, parent.name)  # the seeds' W&B runs side by side
    if jobs > 1:
        summaries = _at_once(config, seeds, parent, min(jobs, len(seeds)), report, starting)
    else:
        summaries = []
        for seed in seeds:
            if starting is not None:
                starting(seed, parent / f"seed_{seed}")
            try:
                summaries.append(seed_run(dataclasses.replace(config, seed=seed, run_dir=None),
                                          parent / f"seed_{seed}", console))
            except Interrupted as e:  # its run saved: the seeds go on from there
                raise Interrupted(f"{e}; or all the seeds with: shoal train --resume {parent}") from None
            if report is not None:
                report(seed, summaries[-1], len(summaries))
    finals = [s["eval_return_mean"] for s in summaries]
    middle, low, high = iqm_interval(finals)
    return {"run_dir": str(parent), "seeds": seeds, "runs": summaries, "eval_return_mean": statistics.fmean(finals),
            "eval_return_std": statistics.pstdev(finals), "eval_return_iqm": middle, "eval_return_iqm_ci": (low, high),
            "solved": sum(s["solved"] for s in summaries),
            "plot": str(plot_aggregate([s["run_dir"] for s in summaries], parent / "curves.png"))}


def _seed_process(config: Any, run_dir: str) -> dict[str, Any]:
    """One seed's run with ``n_jobs`` (:func:`seed_run`), in a process of its own: its progress as
    plain lines labelled with its seed (live bars of several processes would overwrite each other)."""
    from shoal.algos import spec_for
    from shoal.trainer import sigterm_as_ctrl_c

    console = Console(stderr=True, soft_wrap=True, force_terminal=False)
    with sigterm_as_ctrl_c():  # from its start, not only once it trains: the parent's SIGTERM ends it saved
        return seed_run(config, Path(run_dir), console, f"{spec_for(config).name} {config.env} seed {config.seed}")


def _worker_start() -> None:
    """A seeds' worker process between runs ignores SIGTERM: one that died of it would break the
    pool, which then kills the runs still saving (:func:`_seed_process` takes it as Ctrl-C)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _sigterm_to_runs() -> None:
    """SIGTERM to this process (a scheduler's or `timeout`'s stop) is passed on to the seeds'
    processes, each of which saves its run and ends (this one then stops as Ctrl-C stops it). A
    terminal's Ctrl-C reaches every process itself, so SIGINT is not passed on: twice, it would cut
    the runs' checkpoints short."""
    import multiprocessing

    for child in multiprocessing.active_children():
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGTERM)


def _at_once(config: Any, seeds: list[int], parent: Path, jobs: int, report: Report | None,
             starting: Callable[[int, Path], None] | None) -> list[dict]:
    """The seeds' runs in ``jobs`` spawned processes, a run started as one ends, each reported as it
    ends; their summaries in seed order. After a run fails, or Ctrl-C (which ends each running
    run saved, as it ends one), no other starts."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from shoal.trainer import Interrupted, sigterm_as_ctrl_c

    runs = {seed: parent / f"seed_{seed}" for seed in seeds}
    summaries: dict[int, dict] = {}
    pending, running, failure = list(seeds), {}, None
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_start) as pool, sigterm_as_ctrl_c(_sigterm_to_runs):
        def start() -> None:  # one at a time: a run queued in the pool could not be taken back
            seed = pending.pop(0)
            if starting is not None:
                starting(seed, runs[seed])
            running[pool.submit(_seed_process, dataclasses.replace(config, seed=seed, run_dir=None),
                                str(runs[seed]))] = seed

        try:
            while pending and len(running) < jobs:
                start()
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    seed = running.pop(future)
                    if future.exception() is not None:
                        failure = failure or (seed, future.exception())
                        continue
                    summaries[seed] = future.result()
                    if report is not None:
                        report(seed, summaries[seed], len(summaries))
                while pending and failure is None and len(running) < jobs:
                    start()
        except KeyboardInterrupt:  # the running runs got it too: each saves and ends
            wait(running)
            raise Interrupted("interrupted; each seed's run that began saved a checkpoint: continue them with "
                              f"shoal train --resume {parent}") from None
    if failure is not None:
        seed, error = failure
        if isinstance(error, ShoalError):
            raise ShoalError(f"seed {seed}: {error}") from None
        raise error
    return [summaries[seed] for seed in seeds]
