"""Hyperparameter search with Optuna: rl-baselines3-zoo's ``--optimize``, RLlib users' Tune.

Each trial is a whole run (``shoal.train``) in a run directory of its own under the study's;
its settings are the algorithm's defaults, the preset for the env, ``--config`` and ``--set``,
then the values the sampler (TPE) draws for the searched settings. Every evaluation reports the
mean return to Optuna, whose median pruner ends a trial that falls below the median of the
earlier trials at the same step; the final evaluation's mean return is the trial's value. The
study lives in ``study.db`` (SQLite, Optuna's storage: ``optuna-dashboard`` reads it): the same
command with the same ``--study-dir`` runs more trials of it.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from shoal.errors import ConfigError, ShoalError
from shoal.evaluator import format_returns
from shoal.tracking import grouped, require_wandb

GAMMAS = [0.9, 0.95, 0.98, 0.99, 0.995, 0.999]
ON_POLICY = {"lr": "log(1e-5, 1e-2)", "gamma": GAMMAS, "gae_lambda": [0.8, 0.9, 0.92, 0.95, 0.98, 0.99, 1.0],
             "ent_coef": "log(1e-8, 0.1)", "vf_coef": "float(0.2, 1.0)", "max_grad_norm": [0.3, 0.5, 1.0, 2.0, 5.0],
             "hidden_sizes": [[64, 64], [256, 256]], "activation": ["tanh", "relu"]}
OFF_POLICY = {"lr": "log(1e-5, 1e-2)", "gamma": GAMMAS, "batch_size": [32, 64, 128, 256, 512],
              "hidden_sizes": [[64, 64], [256, 256], [400, 300]]}
SMOOTHING = {"tau": [0.001, 0.005, 0.01, 0.02, 0.05]}
DQN = {**OFF_POLICY, "exploration_fraction": "float(0.05, 0.5)", "exploration_final_eps": "float(0.0, 0.2)",
       "target_update_interval": [1, 250, 1000, 5000, 10000]}
SPACES: dict[str, dict[str, Any]] = {
    "ars": {"lr": "log(1e-3, 0.1)", "delta_std": "log(1e-3, 0.2)", "n_delta": [4, 8, 16, 32, 64],
            "policy": ["linear", "mlp"], "hidden_sizes": [[16], [64, 64]]},
    "ppo": {**ON_POLICY, "clip": [0.1, 0.2, 0.3, 0.4], "num_epochs": [1, 5, 10, 20]},
    "a2c": ON_POLICY,
    "impala": ON_POLICY,
    "appo": {**ON_POLICY, "clip": [0.1, 0.2, 0.3, 0.4]},
    "trpo": {**{k: ON_POLICY[k] for k in ("lr", "gamma", "gae_lambda", "hidden_sizes", "activation")},
             "max_kl": "log(1e-3, 5e-2)"},
    "dqn": DQN,
    "qrdqn": {**DQN, "n_quantiles": [10, 25, 50, 200]},
    "sac": {**OFF_POLICY, **SMOOTHING},
    "crossq": {**OFF_POLICY, "critic_hidden_sizes": [[256, 256], [512, 512], [1024, 1024]], "policy_delay": [1, 2, 3]},
    "tqc": {**OFF_POLICY, **SMOOTHING, "top_quantiles_to_drop_per_net": [0, 1, 2, 3, 5]},
    "td3": {**OFF_POLICY, **SMOOTHING, "action_noise": "float(0.0, 0.5)"},
    "ddpg": {**OFF_POLICY, **SMOOTHING, "action_noise": "float(0.0, 0.5)"},
}
"""The settings each algorithm's search draws when no ``--param`` is given (a range as text, a list
of choices), kept to those valid in any combination."""

RETURN = "eval/return_mean"
"""A trial's value by default: its final evaluation's mean return."""


_RANGE = re.compile(r"^\s*(log|float|int)\s*\((.*)\)\s*$")


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched setting: a range (``log``: log-uniform floats, ``float``, ``int``) from
    ``low`` to ``high``, or ``choices``."""

    name: str
    kind: str
    low: float = 0.0
    high: float = 0.0
    choices: tuple[Any, ...] = ()

    @classmethod
    def parse(cls, name: str, spec: Any) -> Param:
        """``log(A, B)``, ``float(A, B)``, ``int(A, B)`` or a list of choices (YAML: ``[64, 128]``,
        ``[[64, 64], [256, 256]]``, ``[tanh, relu]``)."""
        from shoal.config import _number

        if isinstance(spec, str) and (m := _RANGE.match(spec)):
            kind, inner = m[1], [part.strip() for part in m[2].split(",")]
            try:
                low, high = (_number(int if kind == "int" else float, part) for part in inner)
            except (ValueError, TypeError):
                low = high = None
            if len(inner) != 2 or not all(isinstance(v, (int, float)) for v in (low, high)) or not low < high:
                raise ConfigError(f"--param {name}={spec}: a range takes two numbers, the lower first: {kind}(A, B)")
            if kind == "log" and low <= 0:
                raise ConfigError(f"--param {name}={spec}: log(A, B) needs A > 0")
            return cls(name, kind, low, high)
        if isinstance(spec, str):
            spec = _yaml(spec, name)
        if not isinstance(spec, list) or not spec:
            raise ConfigError(f"--param {name}={spec!r}: give a range, log(A, B), float(A, B) or int(A, B), or a list "
                              "of choices, [A, B, ...]")
        return cls(name, "choice", choices=tuple(spec))

    def suggest(self, trial: Any) -> Any:
        """The value ``trial`` draws. Choices are drawn by their YAML text (Optuna's categorical
        values are scalars; a choice may be a list, hidden_sizes')."""
        if self.kind == "choice":
            texts = [_text(c) for c in self.choices]
            return self.choices[texts.index(trial.suggest_categorical(self.name, texts))]
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high))
        return trial.suggest_float(self.name, self.low, self.high, log=self.kind == "log")

    def values(self) -> list[Any]:
        """Values at the ends of the range (or every choice): each must make a valid config."""
        return list(self.choices) if self.kind == "choice" else [
            int(v) if self.kind == "int" else v for v in (self.low, self.high)]

    def describe(self) -> str:
        if self.kind == "choice":
            return f"{self.name} in {', '.join(_text(c) for c in self.choices)}"
        return f"{self.name} {self.kind}({self.low:g}, {self.high:g})"


def _yaml(text: str, name: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise ConfigError(f"--param {name}={text}: not a range or a YAML list of choices") from None


def _text(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def default_space(spec: Any, config: Any) -> dict[str, Any]:
    """The algorithm's :data:`SPACES` for ``config``'s env: without ``hidden_sizes`` and
    ``activation`` where its images go through shoal's convolutional encoder into linear heads
    (PPO's, DQN's, ...), which take neither."""
    space = dict(SPACES.get(spec.name, {}))
    if {"hidden_sizes", "activation"} & space.keys() and config.encoder is None:
        from shoal.envs import EnvOptions, env_spaces
        from shoal.policy import is_image

        obs_space, action_space = env_spaces(config.env, config.env_kwargs, EnvOptions.of(config))
        if is_image(obs_space) and not spec.make_policy(config, obs_space, action_space).layers_after_cnn:
            space.pop("hidden_sizes", None)
            space.pop("activation", None)
    return space


def search_space(algo: str, params: dict[str, Any] | None, config_cls: type) -> list[Param]:
    """The searched settings: ``params`` (name: spec, see :meth:`Param.parse`), each a setting
    of ``config_cls``."""
    from shoal.config import field_names, peer_hint

    space = params
    if not space:
        raise ConfigError(f"no default search space for {algo}: give the settings to search, "
                          "--param lr='log(1e-5, 1e-2)' ...")
    fields = field_names(config_cls)
    out = []
    for name, spec in space.items():
        if name not in fields:
            hint = peer_hint(config_cls, name)
            raise ConfigError(f"--param {name}: {algo} has no setting {name!r}" + (f" ({hint})" if hint else ""))
        out.append(Param.parse(name, spec))
    return out


@dataclasses.dataclass
class Study:
    """What ``shoal tune`` found: the best trial's value and settings, where they are written."""

    study_dir: Path
    best_value: float | None
    best_params: dict[str, Any]
    best_trial_dir: Path | None
    trials: list[dict[str, Any]]


def tune(algo: str, env: str | None = None, trials: int = 20, params: dict[str, Any] | None = None,
         total_steps: int | None = None, evaluations: int = 5, sets: dict[str, Any] | None = None,
         config_file: str | None = None, study_dir: str | Path | None = None, seed: int = 0,
         startup_trials: int = 5, prune: bool = True, timeout_s: float | None = None, n_jobs: int = 1,
         metric: str = RETURN, direction: str = "maximize", sampler: str = "tpe", pruner: str = "median",
         console: Console | None = None) -> Study:
    """Search ``algo``'s settings on ``env`` over ``trials`` runs (more of the study in
    ``study_dir`` if it holds one). ``total_steps`` per trial (default: the preset's), each run
    evaluated ``evaluations`` times; ``sets`` and ``config_file`` fix other settings as
    ``shoal train``'s ``--set`` and ``--config`` do. ``timeout_s`` stops starting trials after that
    many seconds. ``n_jobs`` processes run trials at once, sharing the study (each its share of
    ``trials``; their samplers seeded ``seed``, ``seed + 1``, ...). A trial's value is its final
    evaluation's ``metric`` (an eval.csv column: its mean return, eval/success_rate, eval/KEY of
    ``episode_info``), to ``direction`` ('maximize' or 'minimize'). ``sampler`` draws the settings
    ('tpe' or 'random'); ``pruner`` ('median', 'halving' or 'hyperband') ends trials early where
    ``prune``. Writes ``study.db``,
    ``trials.csv`` and ``best.yaml`` (the fixed and the best searched settings: ``shoal train ALGO
    --env ENV --config best.yaml``) in ``study_dir``."""
    try:
        import optuna
    except ImportError:
        raise ShoalError("shoal tune needs Optuna: pip install 'shoal[tune]'") from None
    from shoal import algos, config as cfg, trainer

    console = console or Console(stderr=True)
    spec = algos.get(algo)
    sets = dict(sets or {})
    base = cfg.build(spec.config_cls, spec.name, env=env, file=config_file, sets=sets)
    if base.wandb_project is not None:
        require_wandb()  # once, not as each trial's failure
    plain = cfg.to_dict(base)  # the fixed settings as the config holds them (YAML's types: a class in Python, its path)
    sets = {k: plain[k] for k in sets if k in plain}
    space = search_space(spec.name, params or default_space(spec, base), spec.config_cls)
    steps = int(total_steps or base.total_steps)
    _check(trials >= 1, "--trials must be at least 1")
    _check(steps >= 1, "--total-steps must be at least 1")
    _check(evaluations >= 1, "--evaluations must be at least 1")
    _check(startup_trials >= 0, "--startup-trials must be 0 or more")
    _check(isinstance(n_jobs, int) and n_jobs >= 1, "--n-jobs must be at least 1")
    _check(isinstance(metric, str) and metric.startswith("eval/") and len(metric) > 5,
           f"--metric names a column of the evaluations (eval.csv): eval/return_mean, eval/success_rate, "
           f"eval/KEY of --episode-info; got {metric!r}")
    _check(direction in ("maximize", "minimize"), f"--direction is maximize or minimize, got {direction!r}")
    _check(sampler in SAMPLERS, f"--sampler is one of {', '.join(SAMPLERS)}, got {sampler!r}")
    _check(pruner in PRUNERS, f"--pruner is one of {', '.join(PRUNERS)}, got {pruner!r}")
    _check(n_jobs == 1 or base.backend == "local", "--n-jobs runs trials in processes of this machine, each its "
           "own run; trials on the ray backend run one at a time (give --n-jobs 1)")
    budget = {"total_steps": steps, "eval_interval": max(1, steps // evaluations), "progress": False,
              "tensorboard": False, "seed": seed}
    for p in space:  # each value a trial can draw makes a valid config, checked before any trial runs
        for value in p.values():
            cfg.build(spec.config_cls, spec.name, env=env, file=config_file,
                      sets={**sets, **budget, p.name: value})
    where = Path(study_dir) if study_dir else Path("runs") / (
        f"tune-{spec.name}-{cfg.preset_env(base.env).replace('/', '_').replace(':', '_')}-"
        f"{datetime.now():%Y%m%d-%H%M%S}")
    record = {"algo": spec.name, "env": base.env, "space": {p.name: _spec_text(p) for p in space}, "sets": sets,
              "config": config_file, "total_steps": steps, "evaluations": evaluations, "seed": seed,
              "metric": metric, "direction": direction}
    _open_study_dir(where, record)
    search = {"sampler": sampler, "pruner": pruner if prune else None, "startup_trials": startup_trials,
              "steps": steps, "first": budget["eval_interval"], "direction": direction}
    study = _load_study(where, seed, search)
    job = {"algo": spec.name, "env": base.env, "space": record["space"], "sets": {**sets, **budget},
           "config": config_file, "where": str(where), "seed": seed, "search": search,
           "width": len(str(len(study.trials) + trials)),
           "deadline": None if timeout_s is None else time.time() + timeout_s, "stderr": console.stderr,
           "metric": metric}

    jobs = min(n_jobs, trials)
    console.print(f"tuning {spec.name} on {base.env}: {trials} trials of {steps:,} steps"
                  + ("" if metric == RETURN else f", to {direction} {metric}")
                  + ("" if sampler == "tpe" else f", drawn by the {sampler} sampler")
                  + ("" if not prune or pruner == "median" else f", pruned by {pruner}")
                  + (f", {jobs} at a time" if jobs > 1 else "") + f", searching "
                  f"{'; '.join(p.describe() for p in space)}; study in {where}", markup=False, highlight=False,
                  soft_wrap=True)
    # best.yaml stands alone: the config file's settings (not where its run was written), the --set ones
    from_file = cfg.read_yaml(config_file) if config_file else {}
    fixed = {k: v for k, v in from_file.items() if k not in ("algo", "run_dir")}
    fixed.update(sets)
    shares = [trials // jobs + (i < trials % jobs) for i in range(jobs)]
    workers = _start_workers(job, shares[1:])
    try:
        with trainer.sigterm_as_ctrl_c():  # a scheduler's or timeout's stop, which reaches this process alone
            _optimize(job, shares[0], 0, console)
            failed = _join(workers)
    except (trainer.Interrupted, KeyboardInterrupt):  # in a trial's run (which saved it), or between trials
        _join(workers, interrupt=True)
        _write_results(optuna.load_study(study_name="shoal", storage=_storage(where)), where, fixed, space, console,
                       metric)
        raise trainer.Interrupted(f"interrupted; the study's trials are in {where}: the same command with --study-dir "
                                  f"{where} runs more of them") from None
    study = _write_results(optuna.load_study(study_name="shoal", storage=_storage(where)), where, fixed, space,
                           console, metric)
    if failed:
        raise ShoalError(f"{failed} of the {jobs} processes running trials failed (their errors are above); the "
                         f"study's trials so far are in {where}")
    return study


def _storage(where: Path) -> Any:
    """The study's SQLite storage; processes that share it wait up to a minute for its lock.

    Opening a new study.db makes its tables, which is not atomic across processes: a process that
    opens it meanwhile (optuna-dashboard, another `shoal tune` of the study, a script loading it)
    can make a table first, and this one's CREATE TABLE fails. The tables are there then: it opens
    it again."""
    import optuna
    import sqlalchemy

    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(f"sqlite:///{where / 'study.db'}",
                                              engine_kwargs={"connect_args": {"timeout": 60}})
        except sqlalchemy.exc.OperationalError as e:
            if "already exists" not in str(e) or attempt == 2:
                raise


SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "halving", "hyperband")


def _load_study(where: Path, seed: int, search: dict[str, Any]) -> Any:
    """The study in ``where`` (made if new), with ``search``'s sampler seeded ``seed`` and its pruner.

    A trial reports each evaluation at its env steps. The median pruner waits for
    ``startup_trials`` complete trials and a third of the steps; successive halving (rl-zoo's
    ``halving``) keeps the best third of the trials at each rung, rungs at the first evaluation's
    steps times 1, 3, 9, ...; Hyperband runs several such halvings, each starting at a later rung."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a failed trial: its line, not a traceback
    steps, first, startup = search["steps"], search["first"], search["startup_trials"]
    pruner = {None: lambda: optuna.pruners.NopPruner(),
              "median": lambda: optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=steps // 3),
              "halving": lambda: optuna.pruners.SuccessiveHalvingPruner(min_resource=first, reduction_factor=3),
              "hyperband": lambda: optuna.pruners.HyperbandPruner(min_resource=first, max_resource=steps,
                                                                  reduction_factor=3)}[search["pruner"]]()
    sampler = (optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup) if search["sampler"] == "tpe"
               else optuna.samplers.RandomSampler(seed=seed))
    return optuna.create_study(study_name="shoal", storage=_storage(where), direction=search["direction"],
                               sampler=sampler, pruner=pruner, load_if_exists=True)


def _optimize(job: dict[str, Any], trials: int, index: int, console: Console) -> None:
    """Run ``trials`` trials of the study ``job`` describes (:func:`tune` made it), as process
    ``index`` of those sharing it: its sampler is seeded ``seed + index``, so that processes draw
    different settings."""
    import optuna

    from shoal import algos, config as cfg, trainer

    spec = algos.get(job["algo"])
    space = search_space(spec.name, job["space"], spec.config_cls)
    where, width = Path(job["where"]), job["width"]
    study = _load_study(where, job["seed"] + index, job["search"])
    metric = job["metric"]
    named = "eval return" if metric == RETURN else metric

    def objective(trial: Any) -> float:
        drawn = {p.name: p.suggest(trial) for p in space}
        config = grouped(cfg.build(spec.config_cls, spec.name, env=job["env"], file=job["config"],
                                   sets={**job["sets"], **drawn}), where.name)  # a study's W&B runs side by side
        run_dir = where / f"trial_{trial.number:04d}"
        reported: list[float] = []

        def report(algo_: Any, metrics: dict[str, Any]) -> bool:
            if metric not in metrics:  # no evaluation this iteration (or none that gave the metric)
                return True
            reported.append(metrics[metric])
            trial.report(metrics[metric], metrics["env_steps"])
            return not trial.should_prune()

        start = time.perf_counter()
        shown = ", ".join(f"{k}={_short(v)}" for k, v in drawn.items())
        try:
            summary = trainer.train(config, run_dir=run_dir, console=Console(file=io.StringIO()), callback=report)
        except trainer.Interrupted:
            raise
        except ShoalError as e:  # this trial's settings (a run that failed): the study goes on
            console.print(f"trial {trial.number:>{width}}: failed: {e} ({shown})", markup=False, highlight=False,
                          soft_wrap=True)
            raise TrialFailed(str(e)) from None
        took = time.perf_counter() - start
        value = _final(run_dir, metric)  # the final evaluation's row (the return: the summary's too)
        if value is None:
            console.print(f"trial {trial.number:>{width}}: failed: its evaluations gave no {metric} ({shown})",
                          markup=False, highlight=False, soft_wrap=True)
            raise TrialFailed(f"no {metric}")
        trial.set_user_attr("run_dir", str(run_dir))
        trial.set_user_attr("env_steps", summary["env_steps"])
        trial.set_user_attr("seconds", round(took, 1))
        if summary["stopped_by_callback"]:
            console.print(f"trial {trial.number:>{width}}: pruned at {summary['env_steps']:,} steps, {named} "
                          f"{format_returns(reported[-1])[0]} ({shown}) {took:.1f} s", markup=False, highlight=False,
                          soft_wrap=True)
            raise optuna.TrialPruned()
        console.print(f"trial {trial.number:>{width}}: {named} {format_returns(value)[0]} ({shown}) {took:.1f} s",
                      markup=False, highlight=False, soft_wrap=True)
        return value

    timeout = None if job["deadline"] is None else max(0.0, job["deadline"] - time.time())
    study.optimize(objective, n_trials=trials, timeout=timeout, catch=(TrialFailed,))


def _worker(job: dict[str, Any], trials: int, index: int) -> None:
    """A process of ``--n-jobs``: its share of the trials; Ctrl-C ends it as it ends the first."""
    from shoal import trainer

    try:
        _optimize(job, trials, index, Console(stderr=job["stderr"], soft_wrap=True))  # where the first one prints
    except (trainer.Interrupted, KeyboardInterrupt):
        pass


def _start_workers(job: dict[str, Any], shares: list[int]) -> list[Any]:
    """Processes running ``shares`` trials each (spawned: this process may hold threads)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_worker, args=(job, n, i + 1)) for i, n in enumerate(shares)]
    for w in workers:
        w.start()
    return workers


def _join(workers: list[Any], interrupt: bool = False) -> int:
    """Wait for the worker processes; how many failed. ``interrupt``: this one was; a terminal's
    Ctrl-C reached them too, and a worker still running a few seconds on (SIGTERM reached this
    process alone) gets a SIGINT, which ends its trial as Ctrl-C does (its run saved)."""
    import signal

    for w in workers if interrupt else ():
        w.join(5)
        if w.is_alive():
            os.kill(w.pid, signal.SIGINT)
    for w in workers:
        w.join()
    return sum(w.exitcode != 0 for w in workers)


def _final(run_dir: Path, metric: str) -> float | None:
    """``metric`` of a run's final evaluation (eval.csv's last row), None where it gave none."""
    from shoal.plot import read_rows

    rows = read_rows(run_dir / "eval.csv", ("env_steps", metric)) if (run_dir / "eval.csv").exists() else []
    return float(rows[-1][metric]) if rows and rows[-1].get(metric) else None


class TrialFailed(Exception):
    """A trial's run failed (its settings, say): Optuna records it as failed and goes on."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _spec_text(p: Param) -> Any:
    return list(p.choices) if p.kind == "choice" else f"{p.kind}({p.low:g}, {p.high:g})"


def _short(value: Any) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.3g}"
    return _text(value)


def _open_study_dir(where: Path, record: dict[str, Any]) -> None:
    """Make the study directory, or check that the one given holds a study of the same search:
    another algorithm, env, space or trial budget would mix trials that cannot be compared."""
    tune_yaml = where / "tune.yaml"
    if is_study(where):
        saved = yaml.safe_load(tune_yaml.read_text()) or {}
        before = {"metric": RETURN, "direction": "maximize"}  # a study from before they were chosen
        differs = [k for k in ("algo", "env", "space", "sets", "config", "total_steps", "evaluations", "metric",
                               "direction") if saved.get(k, before.get(k)) != record[k]]
        if differs:
            raise ConfigError(f"{where} holds a study with other {', '.join(differs)} ({tune_yaml}): run this "
                              "search with another --study-dir, or the study's own settings to add trials to it")
        return
    if where.exists() and any(where.iterdir()):
        raise ConfigError(f"{where} is not empty and holds no study (no tune.yaml): give a new --study-dir")
    try:
        where.mkdir(parents=True, exist_ok=True)
        tune_yaml.write_text(yaml.safe_dump(record, sort_keys=False))
    except OSError as e:
        raise ConfigError(f"cannot write the study directory {where}: {e.strerror or e}") from None


def _write_results(study: Any, where: Path, fixed: dict[str, Any], space: list[Param], console: Console,
                   metric: str = RETURN) -> Study:
    """trials.csv (every trial), best.yaml (the ``fixed`` settings and the best trial's), and a summary."""
    import optuna

    names = [p.name for p in space]
    rows = []
    for t in study.trials:
        params = {p.name: _drawn(p, t.params[p.name]) for p in space if p.name in t.params}
        rows.append({"trial": t.number, "state": t.state.name.lower(), "value": t.value,
                     "env_steps": t.user_attrs.get("env_steps"), "seconds": t.user_attrs.get("seconds"),
                     **{n: _text(params[n]) if n in params else "" for n in names}})
    with open(where / "trials.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["trial", "state", "value", "env_steps", "seconds", *names])
        writer.writeheader()
        writer.writerows(rows)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None
            and math.isfinite(t.value)]
    counts = {s: sum(r["state"] == s for r in rows) for s in ("complete", "pruned", "fail")}
    console.print(f"{len(rows)} trials in the study: {counts['complete']} complete, {counts['pruned']} pruned, "
                  f"{counts['fail']} failed; {where / 'trials.csv'}", markup=False, highlight=False, soft_wrap=True)
    if not done:
        return Study(where, None, {}, None, rows)
    minimize = study.direction == optuna.study.StudyDirection.MINIMIZE
    best = (min if minimize else max)(done, key=lambda t: t.value)
    params = {p.name: _drawn(p, best.params[p.name]) for p in space}
    named = "eval return" if metric == RETURN else metric
    (where / "best.yaml").write_text(
        f"{BEST_HEADER}{best.number}, {named} {best.value:.6g} ({best.user_attrs.get('run_dir')})\n"
        + yaml.safe_dump({**fixed, **params}, sort_keys=False, default_flow_style=None))
    console.print(f"best: trial {best.number}, {named} {format_returns(float(best.value))[0]} "
                  f"({', '.join(f'{k}={_short(v)}' for k, v in params.items())}); {where / 'best.yaml'}",
                  markup=False, highlight=False, soft_wrap=True)
    return Study(where, float(best.value), params, Path(best.user_attrs["run_dir"]), rows)


BEST_HEADER = "# shoal tune: trial "
"""How best.yaml's first line begins: the best trial's number, value and run directory follow."""


def is_study(path: Path) -> bool:
    """Whether ``path`` holds a ``shoal tune`` study (its record, tune.yaml)."""
    return (path / "tune.yaml").is_file()


def best_trial_dir(study_dir: Path) -> str | None:
    """The best trial's run directory, as best.yaml's first line names it (None before one completed)."""
    try:
        first = (study_dir / "best.yaml").read_text(encoding="utf-8").partition("\n")[0]
    except (OSError, ValueError):
        return None
    return first.partition("(")[2].rpartition(")")[0] or None if first.startswith(BEST_HEADER) else None


def _drawn(p: Param, stored: Any) -> Any:
    """A trial's value as the config takes it (a choice is stored as its YAML text)."""
    if p.kind != "choice":
        return stored
    return p.choices[[_text(c) for c in p.choices].index(stored)]
