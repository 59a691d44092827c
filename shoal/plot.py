"""Learning curves: return vs environment steps and vs wall time, several runs overlaid."""

from __future__ import annotations

import csv
import os
from pathlib import Path

from shoal.errors import ShoalError

MANY_RUNS = 4
"""More runs than this in one plot get one legend entry each, beside the panels."""

NOT_SETTINGS = ("seed", "run_dir", "progress", "tensorboard", "log_interval", "wandb_project", "wandb_entity",
                "wandb_group", "wandb_tags")
"""Config keys that do not make runs differ as an experiment: runs that differ in these alone are
the same settings (another seed of them)."""


def read_rows(path: Path, numeric: tuple[str, ...] = ("env_steps",)) -> list[dict[str, str]]:
    """The rows of a run's metrics file (progress.csv, eval.csv), each of its ``numeric`` columns
    checked to be a number where it is filled. A file that is not UTF-8, not CSV, or holds text
    where a number belongs was not written by shoal: a ShoalError names it."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        for row in rows:
            for column in numeric:
                if row.get(column):
                    float(row[column])
        return rows
    except (csv.Error, ValueError) as e:  # UnicodeDecodeError is a ValueError too
        raise ShoalError(f"{path} is not a metrics file shoal can read ({type(e).__name__}: "
                         f"{(str(e).splitlines() or [''])[0][:120]}); move it aside to go on without it") from None


def _read(path: Path, x: str, y: str) -> tuple[list[float], list[float]]:
    if not path.exists():
        return [], []
    rows = [r for r in read_rows(path, (x, y)) if r.get(x) and r.get(y)]
    return [float(r[x]) for r in rows], [float(r[y]) for r in rows]


def steps_and_time_axes(ylabel: str):
    """A figure of two panels, ``ylabel`` against environment steps and against wall time (the
    layout of every learning curve shoal and its benchmarks draw): (figure, (steps_ax, time_ax))."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, label in zip(axes, ("environment steps", "wall time (s)")):
        ax.set_xlabel(label)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    return fig, axes


def save_figure(fig, out: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``out`` through a temporary file (never a half-written PNG), then close it."""
    import matplotlib.pyplot as plt

    out = Path(out)
    kind = out.suffix[1:].lower() or "png"  # the file's format, by its name (matplotlib's rule)
    kinds = fig.canvas.get_supported_filetypes()
    if kind not in kinds:
        plt.close(fig)
        raise ShoalError(f"cannot write {out}: a plot's name ends in one of "
                         f"{', '.join('.' + k for k in sorted(kinds))}")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(tmp, dpi=dpi, format=kind)
        tmp.replace(out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ShoalError(f"cannot write {out}: {e.strerror}") from None
    finally:
        plt.close(fig)
    return out


def metric_file(metric: str) -> str:
    """The metrics file of a run that holds ``metric``: eval.csv for ``eval/...``, else progress.csv."""
    return "eval.csv" if metric.startswith("eval/") else "progress.csv"


def _no_metric(runs: list[Path], metric: str) -> ShoalError:
    """The error for a ``metric`` no run logged, naming the ones its file holds."""
    file = metric_file(metric)
    held = next((rows[0].keys() for r in runs if (r / file).exists() and (rows := read_rows(r / file))), [])
    names = [k for k in held if k not in ("iteration", "env_steps") and not k.startswith("time/")]
    return ShoalError(f"no run has logged {metric} yet" + (f"; their {file} holds {', '.join(names)}" if names else ""))


def plot_runs(run_dirs: list[str | Path], out: str | Path, metric: str | None = None) -> Path:
    """Write a PNG with return (or ``metric``, a column of progress.csv or eval.csv) vs env steps
    and vs wall time for each run; returns its path."""
    # (run index, panel, run, training curve, evaluation curve), all read before a figure exists
    curves = []
    runs = [Path(r) for r in run_dirs]
    for i, run in enumerate(runs):
        if not (run / "progress.csv").exists():
            raise ShoalError(f"{run} has no progress.csv: is it a shoal run directory?")
        for panel, x in enumerate(("env_steps", "time/wall_s")):
            if metric is None:
                curves.append((i, panel, run, _read(run / "progress.csv", x, "episode/return_mean"),
                               _read(run / "eval.csv", x, "eval/return_mean")))
            else:  # one curve a run, drawn as the evaluations are
                curves.append((i, panel, run, ([], []), _read(run / metric_file(metric), x, metric)))
    if not any(train[0] or evals[0] for *_, train, evals in curves):
        if metric is not None:
            raise _no_metric(runs, metric)
        raise ShoalError("nothing to plot yet: the runs have no episodes logged")
    import matplotlib

    fig, axes = steps_and_time_axes(metric or "episode return")
    many = len(runs) > MANY_RUNS  # a study's trials, say: a colour of its own and one legend entry per run
    palette = matplotlib.colormaps["tab20" if len(runs) <= 20 else "turbo"]
    colors = palette.resampled(max(len(runs), 2)) if many else None
    for i, panel, run, (tx, ty), (ex, ey) in curves:
        ax, color = axes[panel], colors(i) if many else f"C{i % 10}"
        if tx:
            label = None if many and ex else run.name if many else f"{run.name} (train, last 100 episodes)"
            ax.plot(tx, ty, color=color, alpha=0.45, lw=1, label=label)
        if ex:
            label = run.name if many or metric else f"{run.name} (eval)"
            ax.plot(ex, ey, color=color, marker="o", ms=3, lw=1.8, label=label)
    if many:  # beside the panels, in columns of up to 25: faint lines are training, dotted ones evaluations
        axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), ncol=(len(runs) + 24) // 25,
                       title=metric or "eval (faint: train)", title_fontsize=7)
    else:
        axes[0].legend(fontsize=7, loc="best")
    return save_figure(fig, out)


BAND_SAMPLES = 2_000
"""Bootstrap resamples of a group's runs at each point of its curve (``stat="iqm"``)."""


def plot_aggregate(run_dirs: list[str | Path], out: str | Path, metric: str = "eval/return_mean",
                   stat: str = "mean") -> Path:
    """Runs grouped by their settings (config.yaml but for :data:`NOT_SETTINGS`), each group drawn
    as the mean of its runs' evaluation returns (or ``metric``, a column of eval.csv or
    progress.csv) with a band of one standard deviation, against env steps and against wall time;
    with ``stat="iqm"``, their interquartile mean with a 95% bootstrap band over the runs (rliable's).
    Each run's curve is read at every point of the group (linearly between its own, its last value
    held after it ended: a run stopped by ``stop_return`` keeps the return it stopped at). A group
    is labelled by the settings that differ between groups."""
    import matplotlib
    import numpy as np
    import yaml

    from shoal.config import read_yaml
    from shoal.seeds import iqm_interval

    groups: dict[str, list[tuple[Path, dict]]] = {}
    for run in map(Path, run_dirs):
        if not (run / "config.yaml").is_file():
            raise ShoalError(f"{run} has no config.yaml: is it a shoal run directory?")
        config = read_yaml(run / "config.yaml")
        key = yaml.safe_dump({k: v for k, v in config.items() if k not in NOT_SETTINGS}, sort_keys=True)
        groups.setdefault(key, []).append((run, config))
    settings = [members[0][1] for members in groups.values()]
    keys = dict.fromkeys(k for c in settings for k in c if k not in NOT_SETTINGS)  # runs of other algorithms too
    differ = [k for k in keys if len({yaml.safe_dump(c.get(k)) for c in settings}) > 1]
    curves = []  # (group, label, [(x grid, mean, std) per panel]), all read before a figure exists
    for g, members in enumerate(groups.values()):
        panels = []
        for x in ("env_steps", "time/wall_s"):
            runs = [_read(run / metric_file(metric), x, metric) for run, _ in members]
            if any(not xs for xs, _ in runs):
                break
            grid = np.unique(np.concatenate([xs for xs, _ in runs]))
            ys = np.array([np.interp(grid, xs, ys) for xs, ys in runs])
            if stat == "iqm":
                panels.append((grid, *iqm_interval(ys, samples=BAND_SAMPLES)))
            else:
                mean, std = ys.mean(axis=0), ys.std(axis=0)
                panels.append((grid, mean, mean - std, mean + std))
        if len(panels) == 2:
            curves.append((g, _group_label(members[0][1], differ, len(members)), panels))
    if not curves:
        if metric != "eval/return_mean":
            raise _no_metric([run for members in groups.values() for run, _ in members], metric)
        raise ShoalError("nothing to plot yet: every group has a run without evaluations logged")
    label = "eval return" if metric == "eval/return_mean" else metric
    over = "IQM, 95% bootstrap CI over runs" if stat == "iqm" else "mean ± std over runs"
    fig, axes = steps_and_time_axes(f"{label} ({over})")
    colors = matplotlib.colormaps["tab10" if len(groups) <= 10 else "turbo"].resampled(max(len(groups), 2))
    for g, label, panels in curves:
        for ax, (x, middle, low, high) in zip(axes, panels):
            ax.plot(x, middle, color=colors(g), lw=1.8, label=label)
            ax.fill_between(x, low, high, color=colors(g), alpha=0.2, lw=0)
    axes[0].legend(fontsize=7, loc="best")
    return save_figure(fig, out)


def _group_label(config: dict, differ: list[str], runs: int, most: int = 3) -> str:
    """The settings ``differ`` of a group's ``config`` (the first ``most``), or its algorithm and env."""
    shown = ", ".join(f"{k}={_setting(config.get(k))}" for k in differ[:most])
    shown += f", +{len(differ) - most} more" if len(differ) > most else ""
    return f"{shown or (config.get('algo', '') + ' ' + str(config['env'])).strip()} ({runs} run{'s' * (runs > 1)})"


def _setting(value) -> str:
    import yaml

    if isinstance(value, float):
        return f"{value:.3g}"
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
