"""The Trainer: runs an Algorithm to its stop condition inside a run directory.

Logging, evaluation, checkpoints, progress and plots happen here, once, for every algorithm.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.progress import (BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.text import Text

from shoal import checkpoint as ckpt
from shoal.algorithm import EVAL_SEED_OFFSET, Algorithm, config_from_dict, make
from shoal.config import read_yaml
from shoal.errors import RoleFailed, ShoalError
from shoal.evaluator import VideoRecorder, format_returns
from shoal.learner import CPU_WAIT_WINDOW_S
from shoal.plot import plot_runs, read_rows
from shoal.rundir import RunDir


class Interrupted(ShoalError):
    """The user stopped the run (Ctrl-C, or SIGTERM from a scheduler or `timeout`); a checkpoint
    was written."""


@contextlib.contextmanager
def sigterm_as_ctrl_c(first: Callable[[], None] | None = None):
    """Within, SIGTERM raises KeyboardInterrupt, as Ctrl-C does, after calling ``first`` (which
    passes it on, say): for a process that waits on others (the seeds' and tune's) or has not begun
    its training loop, which asks its iteration to end instead (:class:`_StopRequest`). Main thread
    only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        if first is not None:
            first()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:  # a handler set outside Python (Ray's) cannot be put back: the default then
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


class _StopRequest:
    """Within (main thread only), Ctrl-C and SIGTERM ask the training loop to stop after its
    iteration (``asked``; the loop then saves as at any interrupt); a second one stops it at once.
    Raising KeyboardInterrupt at any bytecode instead can land inside a lock another thread waits
    on: seen, a run stopped inside TensorBoard's writer queue hung in its close. A signal this
    process ignores (a background job's SIGINT) stays ignored."""

    def __init__(self) -> None:
        self.asked = False
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> _StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self.previous[sig] = signal.signal(sig, self._ask)
        return self

    def _ask(self, signum: int, frame: Any) -> None:
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():  # one set outside Python (Ray's) cannot be put back
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


class _StepRate(ProgressColumn):
    """Env steps per second over the last ~10 s of wall time: rich's own estimate, the one its ETA uses."""

    def render(self, task: Task) -> Text:
        return Text("     -/s" if task.speed is None else f"{task.speed:>6,.0f}/s")


CPU_WAIT_ADVICE = 0.25
"""The ``learner/cpu_wait`` share from which :func:`fit` advises one torch thread (see
:class:`shoal.learner.CpuWait`): 0.44 for SAC's 2 threads beside a busy process on 2 cores,
0.01 alone."""


def _cpu_wait_advice(metrics: dict[str, Any], threads: int) -> str | None:
    """A line for the user when a learner's torch threads wait for CPUs others hold."""
    share = metrics.get("learner/cpu_wait")
    if threads < 2 or share is None or share < CPU_WAIT_ADVICE:
        return None
    return (f"note: the learner's threads waited for a CPU {share:.0%} of their time in the last "
            f"{CPU_WAIT_WINDOW_S:.0f} s: other processes hold this machine's cores, and torch's {threads} "
            f"threads wait for each other at every op, which can slow updates many times over; "
            f"--torch-threads 1 (torch_threads=1) avoids that")


PROGRESS_LINE_S = 30.0
"""Seconds between progress lines where stderr is not a terminal (see :class:`_ProgressLines`)."""


class _ProgressLines:
    """The progress bar's figures as a plain line every :data:`PROGRESS_LINE_S` seconds, for a
    stderr that is not a terminal (a batch job's log file, ``| tee``, CI): there rich's live bar
    shows nothing until the run ends, then one line cut to 80 columns. The bar's interface, as
    :func:`fit` uses it."""

    def __init__(self, console: Console, run_dir: Path):
        self.console, self.run_dir = console, run_dir

    def __enter__(self) -> _ProgressLines:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def add_task(self, description: str, total: int, completed: int, **fields: Any) -> int:
        self.description, self.total = description, total
        self.started = self.last = time.monotonic()
        self.last_steps = completed
        self.print(f"{description}: training to {total:,} env steps in {self.run_dir} "
                   f"(a line every {PROGRESS_LINE_S:g} s)")
        return 0

    def update(self, task: int, completed: int, ret: str, eval: str) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_LINE_S:
            return
        rate = (completed - self.last_steps) / (now - self.last)
        eta = _clock((self.total - completed) / rate) if rate > 0 else "-"
        self.print(f"{self.description} {completed:>9,}/{self.total:,} steps {completed / self.total:4.0%} "
                   f"{rate:>6,.0f}/s return {ret} eval {eval} elapsed {_clock(now - self.started)} ETA {eta}")
        self.last, self.last_steps = now, completed

    def print(self, line: str) -> None:
        self.console.print(line, soft_wrap=True, highlight=False, markup=False)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def _progress(enabled: bool, console: Console, run_dir: Path) -> Progress | _ProgressLines:
    if enabled and not (console.is_terminal or console.is_jupyter):
        return _ProgressLines(console, run_dir)
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(bar_width=20),
        TextColumn("{task.completed:>9,.0f}/{task.total:,.0f} steps"), _StepRate(),
        TextColumn("return {task.fields[ret]} eval {task.fields[eval]}"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
        console=console, disable=not enabled, refresh_per_second=4, speed_estimate_period=10)


def _best_eval(run: RunDir, upto: int | None = None) -> tuple[float, int]:
    """The best evaluation's mean return in the run so far (up to ``upto`` env steps), and how many
    evaluations came after it."""
    return _best_and_after([float(r["eval/return_mean"]) for r in run.evals.rows() if r.get("eval/return_mean")
                            and (upto is None or float(r.get("env_steps") or 0) <= upto)])


def _best_and_after(returns: list[float]) -> tuple[float, int]:
    """The best of evaluations' mean ``returns`` (-inf for none), and how many came after it."""
    if not returns:
        return -math.inf, 0
    best = max(returns)
    return best, len(returns) - 1 - returns.index(best)


Callback = Callable[[Algorithm, dict[str, Any]], "bool | None"]


def fit(algo: Algorithm, run: RunDir, console: Console | None = None, callback: Callback | None = None,
        label: str | None = None) -> dict[str, Any]:
    """Train until ``total_steps``, ``stop_return``, ``stop_patience``, ``stop_time_s`` or ``stop_episodes``;
    returns a summary of the run.

    ``callback(algo, metrics)``, if given, runs after every iteration (after its row of
    progress.csv, when it has one: see ``log_interval``, and its evaluation, when it has one:
    ``metrics`` then hold ``eval/return_mean`` and the rest of it); returning False ends the run
    there, as a stable-baselines3 callback's ``False`` does (the final evaluation, checkpoint and
    plot as at any stop; the summary's ``stopped_by_callback`` says so). ``label`` names the run in
    its progress bar (default: the algorithm and env)."""
    recorder = None
    if algo.config.video_interval:
        recorder = VideoRecorder(algo.config, run.path / "videos", algo.config.seed + EVAL_SEED_OFFSET)
    try:
        return _fit(algo, run, console, callback, recorder, label)
    finally:
        if recorder is not None:
            recorder.close()


def _fit(algo: Algorithm, run: RunDir, console: Console | None, callback: Callback | None,
         recorder: VideoRecorder | None, label: str | None) -> dict[str, Any]:
    """:func:`fit`'s loop, with its video recorder (None: no videos)."""
    c, console = algo.config, console or Console(stderr=True)
    algo.start_evaluator()  # now, beside the other roles, not at the first evaluation
    every = lambda interval, steps: steps // interval if interval else 0  # noqa: E731
    last_eval, last_ckpt = every(c.eval_interval, algo.env_steps), every(c.checkpoint_interval, algo.env_steps)
    last_log = every(c.log_interval, algo.env_steps)
    (best, stale), evaluation, solved, halted = _best_eval(run), None, False, False
    saved: tuple[int, Path] | None = None  # (env_steps, path) of the newest periodic checkpoint
    logged = (algo.env_steps, algo.elapsed_s)  # env steps and training seconds at the last row
    unlogged: dict[str, Any] | None = None  # the newest iteration's metrics, if not written yet

    def log(metrics: dict[str, Any]) -> None:
        """Write the row, its env steps per second taken since the row before (over every
        iteration this row stands for)."""
        nonlocal logged, unlogged
        steps, seconds = metrics["env_steps"] - logged[0], metrics["time/elapsed_s"] - logged[1]
        run.log({**metrics, "time/env_steps_per_s": steps / seconds} if seconds > 0 else metrics)
        logged, unlogged = (metrics["env_steps"], metrics["time/elapsed_s"]), None

    def save() -> Path:
        nonlocal saved
        path = algo.save(run.checkpoints / f"ckpt_{algo.iteration:09d}")
        ckpt.prune(run.path, c.keep_checkpoints)
        saved = (algo.env_steps, path)
        return path

    def reached(result: dict[str, Any]) -> bool:
        return c.stop_return is not None and result["eval/return_mean"] >= c.stop_return

    def out_of_time() -> bool:
        return c.stop_time_s is not None and algo.wall_s >= c.stop_time_s

    def out_of_episodes() -> bool:
        return c.stop_episodes is not None and algo.num_episodes >= c.stop_episodes

    def evaluate() -> dict[str, Any]:
        nonlocal best, stale
        result = algo.evaluate()
        run.log(result, evaluation=True)
        if result["eval/return_mean"] > best:
            best, stale = result["eval/return_mean"], 0
            algo.save(run.checkpoints / "best")
        else:
            stale += 1
        return result

    def stalled() -> bool:
        return c.stop_patience is not None and stale >= c.stop_patience

    name = label or f"{algo.spec.name} {c.env}"
    last_video = every(c.video_interval, algo.env_steps)
    videos: list[Path] = []

    def record() -> None:
        if recorder is not None:
            videos.append(recorder.record(algo.get_policy().module, algo.env_steps))
            run.log_video(videos[-1], algo.env_steps)

    run.mark_live(algo.backend.live_store())
    try:
        # set once the roles run: starting Ray installs its own SIGTERM handler
        with _StopRequest() as stop, _progress(c.progress, console, run.path) as bar:
            task = bar.add_task(name, total=c.total_steps, completed=algo.env_steps, ret="-", eval="-")
            ran = False  # the time limit ends a run after an iteration, as RLlib's time_total_s does
            advised = False  # once a run

            def more() -> bool:
                """Whether the run has more to train."""
                return (algo.env_steps < c.total_steps and not solved and not halted and not stalled()
                        and not (ran and out_of_time()) and not out_of_episodes())

            while more() and not stop.asked:
                metrics, ran = algo.train(), True
                if every(c.log_interval, algo.env_steps) > last_log:
                    last_log = every(c.log_interval, algo.env_steps)
                    log(metrics)
                else:
                    unlogged = metrics
                if not advised and (advice := _cpu_wait_advice(metrics, c.torch_threads)):
                    bar.console.print(advice, soft_wrap=True, highlight=False, markup=False)
                    advised = True
                evaluated = every(c.eval_interval, algo.env_steps) > last_eval
                if evaluated:
                    last_eval = every(c.eval_interval, algo.env_steps)
                    evaluation = evaluate()
                    solved = reached(evaluation)
                if every(c.video_interval, algo.env_steps) > last_video:
                    last_video = every(c.video_interval, algo.env_steps)
                    record()
                if every(c.checkpoint_interval, algo.env_steps) > last_ckpt:
                    last_ckpt = every(c.checkpoint_interval, algo.env_steps)
                    save()
                if callback is not None:
                    halted = callback(algo, {**metrics, **evaluation} if evaluated else metrics) is False
                ret = metrics.get("episode/return_mean")
                bar.update(task, completed=min(algo.env_steps, c.total_steps),
                           ret="-" if ret is None else format_returns(ret)[0],
                           eval="-" if evaluation is None else format_returns(evaluation["eval/return_mean"])[0])
            if unlogged is not None:  # the last iteration always has its row
                log(unlogged)
            if stop.asked and more():
                raise KeyboardInterrupt  # saved below, as a second Ctrl-C's is
    except KeyboardInterrupt:
        if unlogged is not None:
            log(unlogged)
        path = save()
        run.close()
        raise Interrupted(f"interrupted at {algo.env_steps:,} steps; checkpoint {path}; "
                          f"continue with: shoal train --resume {run.path}") from None
    if evaluation is None or evaluation["env_steps"] != algo.env_steps:
        evaluation = evaluate()
        solved = reached(evaluation)
    if recorder is not None and not (videos and videos[-1].name == f"step_{algo.env_steps:09d}.mp4"):
        record()  # the last policy's, as the final evaluation's
    last = saved[1] if saved is not None and saved[0] == algo.env_steps else save()
    run.close()
    plot = plot_runs([run.path], run.path / "curve.png")
    ended = not solved and not halted and not stalled() and algo.env_steps < c.total_steps  # by a limit of its own
    return {"run_dir": str(run.path), "env_steps": algo.env_steps, "iterations": algo.iteration,
            "elapsed_s": algo.elapsed_s, "eval_return_mean": evaluation["eval/return_mean"],
            "eval_return_std": evaluation["eval/return_std"], "best_eval_return": best,
            "eval_success_rate": evaluation.get("eval/success_rate"),
            "solved": solved, "stopped_by_callback": halted,
            "stalled": not solved and not halted and stalled(),
            "timed_out": ended and out_of_time(),
            "out_of_episodes": ended and not out_of_time() and out_of_episodes(), "episodes": algo.num_episodes,
            "checkpoint": str(last), "plot": str(plot), "wall_s": algo.wall_s, "patience": c.stop_patience,
            "videos": str(run.path / "videos") if videos else None,
            "wandb": run.wandb.where if run.wandb is not None else None}


def _fit_restarting(algo: Algorithm, run: RunDir, console: Console | None, callback: Callback | None,
                    label: str | None = None) -> dict[str, Any]:
    """:func:`fit`, restarted from the newest checkpoint when a role fails, up to --max-failures
    times (ray backend; a failure in-process is a bug, not a crash, and is raised)."""
    import logging

    config, failures = algo.config, 0
    while True:
        try:
            with algo:
                summary = fit(algo, run, console, callback, label)
            summary["failures"] = failures
            return summary
        except RoleFailed as e:
            failures += 1
            if config.backend != "ray" or failures > config.max_failures:
                more = f" after {failures - 1} restarts" if failures > 1 else ""
                raise ShoalError(f"a role failed{more} ({e}); the run can be continued with "
                                 f"`shoal train --resume {run.path}`" +
                                 ("" if config.backend != "ray" else " (or set --max-failures)")) from None
            logging.getLogger("shoal").warning("a role failed (%s): restart %d of %d from the newest checkpoint",
                                               e, failures, config.max_failures)
            found = ckpt.checkpoints_in(run.path)
            if found:
                algo = Algorithm(config)
                algo.restore(found[-1])
            else:  # failed before its first checkpoint: a new start, from --init-from's networks where given
                algo = make(config)
            run.progress.truncate_after(algo.env_steps)
            run.evals.truncate_after(algo.env_steps)
        finally:
            run.clear_live()  # the store stopped with the roles (a restart's fit names its new one)


def _track(run: RunDir, name: str, config: Any, console: Console | None, label: str | None) -> None:
    """Start the run's W&B run (where --wandb-project asks for one), and say where it is."""
    run.track(name, config)
    if run.wandb is not None:
        where = run.wandb.where
        (console or Console(stderr=True)).print(f"{label}: {where}" if label else where, soft_wrap=True,
                                                highlight=False, markup=False)


def _failed() -> bool:
    """Whether the exception being raised (in a ``finally``) ends the run as a failure: not Ctrl-C's."""
    error = sys.exc_info()[1]
    return error is not None and not isinstance(error, Interrupted)


def _say_ray_starts(config: Any, console: Console | None, name: str) -> None:
    """On the ray backend, say what starts before it does: Ray's start and a process per role
    that imports torch take 10 s and more (a minute for many runners on few cores) before the
    progress bar's first line, and Ray itself says nothing at shoal's log level."""
    if config.backend != "ray" or not config.progress:
        return
    from shoal.backends import ray_destination

    runners = f"{config.num_env_runners} env runner{'s' if config.num_env_runners != 1 else ''}"
    (console or Console(stderr=True)).print(f"{name} {config.env}: starting {runners} and the learner on "
                                            f"{ray_destination(config)}", soft_wrap=True, highlight=False, markup=False)


def train(config: Any, run_dir: str | Path | None = None, console: Console | None = None,
          callback: Callback | None = None, label: str | None = None) -> dict[str, Any]:
    """Train ``config`` in a new run directory; returns the run summary. ``callback(algo, metrics)``
    runs after every iteration; it ends the run by returning False. ``label`` names the run in its
    progress bar (default: the algorithm and env)."""
    from shoal.algos import spec_for

    name = spec_for(config).name
    path = Path(run_dir or config.run_dir or RunDir.default_path(name, config.env, config.seed))
    if (path / "config.yaml").exists():
        raise ShoalError(f"{path} already holds a run: continue it with `shoal train --resume {path}`, "
                         "or choose another --run-dir")
    run = RunDir(path, config.tensorboard)
    try:
        # SIGTERM while the roles start (Ray's processes too, where it reached the whole process
        # group, as `timeout`'s and Slurm's do) stops the command as Ctrl-C does
        with sigterm_as_ctrl_c():
            _track(run, name, config, console, label)
            _say_ray_starts(config, console, name)
            algo = make(config)
    except BaseException:
        run.discard()  # a run that never started leaves nothing behind
        raise
    try:
        run.write_config(name, config)
    except BaseException:
        algo.stop()
        run.release()
        raise
    try:
        return _fit_restarting(algo, run, console, callback, label)
    except BaseException as e:
        # A run that failed before its first iteration (an env that breaks every time) holds
        # nothing to resume: leave nothing behind, so that it can be trained again once fixed.
        if not isinstance(e, Interrupted) and algo.env_steps == 0 and not any(run.checkpoints.glob("*")):
            run.discard()
        raise
    finally:
        run.release(failed=_failed())


def read_run_config(run_dir: str | Path) -> dict[str, Any]:
    """The saved config.yaml of a run directory, with its ``algo`` key."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        from shoal.checkpoint import runs_held

        if runs_held(Path(run_dir)):
            raise ShoalError(runs_held(Path(run_dir)))
        run = next((p for p in Path(run_dir).parents[:2] if (p / "config.yaml").is_file()), None)
        hint = f": it is inside the run directory {run}; give that" if run else ""
        raise ShoalError(f"{run_dir} is not a shoal run directory (no config.yaml){hint}")
    saved = read_yaml(path)
    if "algo" not in saved:
        raise ShoalError(f"{path} does not name its algorithm")
    return saved


def finished_summary(run_dir: str | Path, config: Any) -> dict[str, Any] | None:
    """The summary of a run that ``config`` would not train further (its newest checkpoint at
    total_steps, its last evaluation at stop_return, stop_patience evaluations in a row no better,
    its wall time at stop_time_s, or its training episodes at stop_episodes), read from its files as
    :func:`fit` gives it; None for a run that trains on."""
    path = ckpt.resolve(run_dir)
    meta = ckpt.read_meta(path)
    steps = int(meta["env_steps"])
    run = Path(run_dir)
    evals = [r for r in read_rows(run / "eval.csv", ("env_steps", "eval/return_mean"))
             if r.get("eval/return_mean") and float(r["env_steps"]) <= steps] if (run / "eval.csv").exists() else []
    returns = [float(r["eval/return_mean"]) for r in evals]
    best, stale = _best_and_after(returns)
    solved = bool(returns) and config.stop_return is not None and returns[-1] >= config.stop_return
    stalled = config.stop_patience is not None and stale >= config.stop_patience
    progress = [r for r in read_rows(run / "progress.csv", ("env_steps", "time/wall_s", "episode/count"))
                if float(r.get("env_steps") or 0) <= steps] if (run / "progress.csv").exists() else []
    wall = float(progress[-1].get("time/wall_s") or 0.0) if progress else 0.0
    timed_out = config.stop_time_s is not None and wall >= config.stop_time_s
    episodes = int(float(progress[-1].get("episode/count") or 0)) if progress else 0
    out_of_episodes = config.stop_episodes is not None and episodes >= config.stop_episodes
    if not (steps >= config.total_steps or solved or stalled or timed_out or out_of_episodes) or not evals:
        return None
    ended = not solved and not stalled and steps < config.total_steps
    last = evals[-1]
    success = last.get("eval/success_rate")
    return {"run_dir": str(run), "env_steps": steps, "iterations": int(meta["iteration"]),
            "elapsed_s": float(progress[-1]["time/elapsed_s"]) if progress else 0.0,
            "eval_return_mean": returns[-1], "eval_return_std": float(last.get("eval/return_std") or 0.0),
            "best_eval_return": best, "eval_success_rate": float(success) if success else None,
            "solved": solved, "stopped_by_callback": False, "stalled": not solved and stalled,
            "timed_out": ended and timed_out, "out_of_episodes": ended and not timed_out and out_of_episodes,
            "episodes": episodes, "checkpoint": str(path), "plot": str(run / "curve.png"), "wall_s": wall,
            "patience": config.stop_patience, "videos": str(run / "videos") if (run / "videos").is_dir() else None,
            "ended_before": True}


def run_config(run_dir: str | Path) -> tuple[str, Any]:
    """(algorithm name, config) a run directory was started with."""
    saved = read_run_config(run_dir)
    algo = saved.pop("algo")
    return algo, config_from_dict(algo, saved, str(Path(run_dir) / "config.yaml"))


def resume(run_dir: str | Path, config: Any | None = None, console: Console | None = None,
           callback: Callback | None = None, label: str | None = None) -> dict[str, Any]:
    """Continue a run from its newest complete checkpoint, in the same directory.

    ``config`` may change settings that do not alter the run's shape (e.g. total_steps). ``label``
    names the run in its progress bar (default: the algorithm and env).
    """
    if config is None:
        algo, config = run_config(run_dir)
    else:
        algo = read_run_config(run_dir)["algo"]
    try:
        checkpoint = ckpt.resolve(run_dir)
    except ShoalError:
        raise ShoalError(f"{run_dir} holds no complete checkpoint: the run stopped before it wrote one, so "
                         f"there is nothing to resume; train afresh with another --run-dir (or delete {run_dir})") from None
    run = RunDir(run_dir, config.tensorboard)
    try:
        with sigterm_as_ctrl_c():  # as train's start
            _say_ray_starts(config, console, algo)
            instance = Algorithm(config)
        try:
            with sigterm_as_ctrl_c():
                instance.restore(checkpoint)
            if instance.env_steps >= config.total_steps:
                raise ShoalError(f"{run_dir} already reached total_steps={config.total_steps:,}: "
                                 f"pass a larger --total-steps to train on")
            if config.stop_time_s is not None and instance.wall_s >= config.stop_time_s:
                raise ShoalError(f"{run_dir} already ran for {instance.wall_s:.0f} s of stop_time_s="
                                 f"{config.stop_time_s:g}: pass a larger --stop-time-s to train on")
            if config.stop_episodes is not None and instance.num_episodes >= config.stop_episodes:
                raise ShoalError(f"{run_dir} already ended {instance.num_episodes:,} training episodes of "
                                 f"stop_episodes={config.stop_episodes:,}: pass a larger --stop-episodes to train on")
            stale = _best_eval(run, instance.env_steps)[1]
            if config.stop_patience is not None and stale >= config.stop_patience:
                raise ShoalError(f"{run_dir} already had {stale} evaluations in a row no better than its best, of "
                                 f"stop_patience={config.stop_patience}: pass a larger --stop-patience (or --set "
                                 "stop_patience=null) to train on")
            _track(run, algo, config, console, label)
            run.write_config(algo, config)  # only once the checkpoint took these settings
        except BaseException:
            instance.stop()
            raise
        run.progress.truncate_after(instance.env_steps)
        run.evals.truncate_after(instance.env_steps)
        return _fit_restarting(instance, run, console, callback, label)
    finally:
        run.release(failed=_failed())
