"""The ``shoal`` command: train, eval, plot, algos, envs.

User mistakes end in one line on stderr and exit code 2; tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import os
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, Union, get_args, get_origin

import tyro
import tyro._arguments
import tyro._docstrings
import tyro._fmtlib
import tyro.constructors
from rich.console import Console
from rich.table import Table

from shoal.errors import ShoalError


def _cleaned_field_docs(read):
    """tyro 1.0.16 takes a field's docstring as docstring_parser returns it, with its continuation
    lines still indented, and starts a new help line at each indented line ("... an env with no" /
    "time limit ..."). Clean each one as Python cleans any docstring (PEP 257), so a field's help
    is one paragraph however its docstring is wrapped in the source."""

    def parse(obj: object) -> dict[str, str]:
        return {name: inspect.cleandoc(doc) for name, doc in read(obj).items()}

    return parse


tyro._docstrings.parse_docstring_from_object = _cleaned_field_docs(tyro._docstrings.parse_docstring_from_object)


def _default_said_once(generate):
    """tyro 1.0.16 ends every optional flag's help with ``(default: X)``. Where the help already
    says ``default: ...``, tyro's contradicts it (``--run-dir ... (default: runs/ALGO-ENV-TIME).
    (default: None)``); where the default is an empty list it says nothing (``RUN_DIR [RUN_DIR
    ...] Run directories. (default: )``). Drop tyro's hint in those two cases."""

    def helptext(arg, lowered, compact: bool = False):
        text = generate(arg, lowered, compact)
        *rest, hint = text._segments
        hint = hint if isinstance(hint, str) else hint.as_str_no_ansi()
        own = arg.field.helptext() if callable(arg.field.helptext) else arg.field.helptext
        if hint.startswith("(default:") and (hint == "(default: )" or "default:" in (own or "").lower()):
            return tyro._fmtlib.text(*rest[:-1])  # the hint and the space before it
        return text

    return helptext


tyro._arguments.generate_argument_helptext = _default_said_once(tyro._arguments.generate_argument_helptext)

_NUMBERS = tyro.constructors.ConstructorRegistry()


@_NUMBERS.primitive_rule
def _whole_numbers(info: tyro.constructors.PrimitiveTypeInfo) -> tyro.constructors.PrimitiveConstructorSpec | None:
    """Integer flags take a whole number in exponent form (``--total-steps 1e6``), as ``--set`` and
    config files do; tyro's own rule calls ``int()``, which refuses it."""
    if info.type is not int:
        return None
    return tyro.constructors.PrimitiveConstructorSpec(
        nargs=1, metavar="INT", instance_from_str=lambda args: _whole_number(args[0]),
        is_instance=lambda x: isinstance(x, int) and not isinstance(x, bool), str_from_instance=lambda x: [str(x)])


def _whole_number(text: str) -> int:
    from shoal.config import _number

    value = _number(int, text)
    if not isinstance(value, int):
        raise ValueError(f"{text!r} is not a whole number")
    return value


@_NUMBERS.primitive_rule
def _optional(info: tyro.constructors.PrimitiveTypeInfo) -> tyro.constructors.PrimitiveConstructorSpec | None:
    """An optional number or text (``--stop-return FLOAT``, default None), or list of them
    (``--critic-hidden-sizes [INT [INT ...]]``), is shown as its type, where tyro shows
    ``{None}|FLOAT``, which reads as if None were the value to give; ``None`` is still taken."""
    if get_origin(info.type) not in (Union, types.UnionType):
        return None
    kinds = [t for t in get_args(info.type) if t is not type(None)]
    if len(kinds) != 1 or len(get_args(info.type)) != 2:
        return None
    many = get_origin(kinds[0]) is tuple and get_args(kinds[0])[1:] == (Ellipsis,)  # tuple[int, ...]
    kind = get_args(kinds[0])[0] if many else kinds[0]
    if kind not in (int, float, str):
        return None
    parse = _whole_number if kind is int else kind
    name = kind.__name__.upper()
    values = (lambda x: x) if many else (lambda x: (x,))  # noqa: E731 - a flag's values; a number is one
    return tyro.constructors.PrimitiveConstructorSpec(
        nargs="*" if many else 1, metavar=f"[{name} [{name} ...]]" if many else name,
        instance_from_str=lambda args: (None if args == ["None"] else tuple(map(parse, args)) if many
                                        else parse(args[0])),
        is_instance=lambda x: x is None or ((isinstance(x, tuple) or not many)
                                            and all(isinstance(v, kind) and not isinstance(v, bool) for v in values(x))),
        str_from_instance=lambda x: ["None"] if x is None else [str(v) for v in values(x)])


_RULES = {"positive": lambda v: v > 0, "at least 0": lambda v: v >= 0, "at least 1": lambda v: v >= 1}


def _check_flags(*flags: tuple[str, float, str]) -> None:
    """Refuse the first of these numeric flags that breaks its rule (a key of ``_RULES``), naming it
    and the value given."""
    for flag, value, rule in flags:
        if not _RULES[rule](value):
            raise ShoalError(f"{flag} must be {rule}, got {value:g}")


def _parse(cls: type, argv: list[str], prog: str, **kwargs: Any) -> Any:
    """``tyro.cli``, with a rejected command line as one line (a ShoalError) like every other
    mistake: tyro draws a box of 4-10 lines. ``--help`` still prints and exits as tyro does."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            parsed = tyro.cli(cls, args=argv, prog=prog, registry=_NUMBERS, **kwargs)
    except SystemExit as e:
        if not e.code:
            raise
        message = _one_line(captured.getvalue(), prog)
        if message.startswith("Unrecognized options: "):  # a peer's name, or another algorithm's setting: say so
            from shoal.config import owners_hint, peer_hint

            flags = [arg.partition("=")[0] for arg in argv if arg.startswith("--")]
            hints = [hint for flag in flags
                     if (hint := peer_hint(cls, flag, flags=True) or owners_hint(cls, flag, flags=True))]
            if hints:
                message = message.split(";")[0].removesuffix(f" (see {prog} --help)")
                message = f"{message}; {'; '.join(dict.fromkeys(hints))} (see {prog} --help)"
        raise ShoalError(message) from None
    sys.stderr.write(captured.getvalue())  # anything else tyro said (warnings)
    return parsed


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _one_line(box: str, prog: str) -> str:
    """tyro's error box as one line: its message (wrapped lines joined, the arguments' help
    left out) and the flags it suggests for a misspelt one. tyro draws the box in UTF-8 or, when
    stdout is not UTF-8, in ASCII (a title row, a rule, contents indented by two)."""
    lines = [line.rstrip() for line in _ANSI.sub("", box).splitlines() if line.strip()]
    utf8 = bool(lines) and lines[0].lstrip().startswith("╭")
    if not utf8 and not (len(lines) > 1 and set(lines[1].strip()) == {"-"}):  # not a box: say it as it is
        return f"{' '.join(line.strip() for line in lines) or 'the command line was rejected'} (see {prog} --help)"
    sections: list[list[tuple[int, str]]] = [[]]
    for line in lines[1:-1] if utf8 else lines[1:]:  # the title row and the bottom edge dropped
        line = line.removesuffix(" │")[2:]
        if len(line.strip()) >= 3 and set(line.strip()) <= set("─-"):  # a rule between sections
            sections.append([])
        else:
            sections[-1].append((len(line) - len(line.lstrip()), line.strip()))
    sections = [section for section in sections if section] or [[]]
    message = " ".join(text for indent, text in sections[0] if indent < 8)  # 8: an argument's help
    message = message or lines[0].strip(" ╭─╮")  # the box's title, at least
    for section in sections[1:]:
        if section[0][1] == "Perhaps you meant:":
            # a flag, or a bool's pair of them ("--tensorboard, --no-tensorboard": the first)
            flags = [text.replace(",", " ").split()[0] for indent, text in section[1:] if indent == 4]
            message += f"; did you mean {' or '.join(flags)}?" if flags else ""
    return f"{message} (see {prog} --help)"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a mistake as one line (argparse prints its usage, then the error)."""

    def error(self, message: str) -> NoReturn:
        raise ShoalError(f"{message} (see {self.prog} --help)")


USAGE = """usage: shoal COMMAND ...

commands:
  train ALGO --env ENV_ID [options]   train (see `shoal train ALGO --help` for every option)
  train --resume RUN_DIR              continue a run from its newest checkpoint
  eval RUN_DIR_OR_CHECKPOINT          evaluate a trained policy (--episodes, --video DIR, --deterministic/--stochastic)
  export RUN_DIR_OR_CHECKPOINT        write the policy as an ONNX model (--out FILE.onnx), for runtimes without Python
  plot RUN_DIR [RUN_DIR ...]          learning curves (return vs env steps and vs wall time; runs/: each run in it)
  serve-env ENV_ID --num-envs N       serve envs to trainers and other languages over gRPC
  serve-policy RUN_DIR [RUN_DIR ...]  serve trained policies to simulators over gRPC (batched)
  algos                               list algorithms and their presets
  envs [TEXT ...]                     list environment ids (containing any TEXT, in any case) and their presets
  check-env ENV_ID                    check that an env is ready to train on (Gymnasium's checker, algorithms, speed;
                                      remote:// env servers: the protocol's checks)
  tune ALGO --env ENV_ID [--trials N]  search its settings with Optuna (--param NAME=SPEC ...; best.yaml for train)
"""

TRAIN_HELP = """Train {algo} on a Gymnasium environment.

Settings come from, in rising priority: the defaults below, the shipped preset for
(algorithm, env), --config FILE.yaml (a flat mapping of these settings), --set key=value
(repeatable; values read as YAML), and the flags below.

Also: --config FILE.yaml, --set key=value ..., --resume RUN_DIR (continue that run),
--seeds S ... (a run per seed, in DIR/seed_S, then their mean; --n-jobs N trains N at once),
--env-kwargs KEY=VALUE ... (the env constructor's keyword arguments, as gym.make takes them:
--env-kwargs is_slippery=false map_name=8x8; values read as YAML; setting env_kwargs),
--eval-env-kwargs KEY=VALUE ... (the evaluation envs' keyword arguments, over --env-kwargs; setting eval_env_kwargs),
--encoder-kwargs KEY=VALUE ... (the --encoder class's keyword arguments; setting encoder_kwargs),
--env-wrapper module:Name [KEY=VALUE ...] (a wrapper around every env, with its keyword arguments;
repeat it for more, innermost first; setting env_wrappers)."""


def _pre_parser(prog: str) -> argparse.ArgumentParser:
    pre = _Parser(prog=prog, add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    pre.add_argument("--set", action="append", nargs="+", default=[])
    pre.add_argument("--resume")
    pre.add_argument("--env", action="append")  # repeated: several remote:// env servers
    pre.add_argument("--env-kwargs", action="append", nargs="+", default=[])
    pre.add_argument("--eval-env-kwargs", action="append", nargs="+", default=[])
    pre.add_argument("--encoder")  # with --encoder-kwargs, which a config checks against it
    pre.add_argument("--encoder-kwargs", action="append", nargs="+", default=[])
    pre.add_argument("--env-wrapper", "--env-wrappers", dest="env_wrapper", action="append", nargs="+", default=[])
    pre.add_argument("--seeds", nargs="+")  # one run per seed, in turn
    pre.add_argument("--n-jobs", type=int)  # --seeds' runs at once
    return pre


def wrapper_groups(groups: list[list[str]]) -> list[Any]:
    """``--env-wrapper module:Name KEY=VALUE ...`` flags (each a group: the name, then its keyword
    arguments read as YAML) as ``env_wrappers`` entries."""
    from shoal.config import parse_set

    return [{name: parse_set(rest, f"--env-wrapper {name}")} if rest else name for name, *rest in groups]


def _take_wrappers(argv: list[str]) -> tuple[list[str], list[Any]]:
    """``argv`` without its ``--env-wrapper`` flags, and what they give (:func:`wrapper_groups`)."""
    rest: list[str] = []
    groups: list[list[str]] = []
    taking = False
    for arg in argv:
        if arg in ("--env-wrapper", "--env-wrappers"):  # the setting's name, env_wrappers, as a flag too
            groups.append([])
            taking = True
        elif arg.startswith(("--env-wrapper=", "--env-wrappers=")):
            groups.append([arg.partition("=")[2]])
            taking = True
        elif taking and not arg.startswith("-") and (not groups[-1] or "=" in arg):  # the name, then KEY=VALUEs
            groups[-1].append(arg)
        else:
            taking = False
            rest.append(arg)
    if any(not group for group in groups):
        raise ShoalError("--env-wrapper takes 'module:Name', then its keyword arguments KEY=VALUE ...")
    return rest, wrapper_groups(groups)


def cmd_train(argv: list[str], console: Console) -> int:
    from shoal import algos, config as cfg, trainer

    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE.splitlines()[0].replace("COMMAND", "train ALGO") + "\n\nalgorithms: " + ", ".join(sorted(algos.ALGOS)))
        return 0 if argv else 2
    algo_name = None if argv[0].startswith("-") else argv[0]
    known, rest = _pre_parser(f"shoal train {algo_name or ''}".rstrip()).parse_known_args(argv[1:] if algo_name else argv)
    sets = cfg.parse_set([item for group in known.set for item in group])
    if known.env_kwargs:
        sets["env_kwargs"] = cfg.parse_set([item for group in known.env_kwargs for item in group], "--env-kwargs")
    if known.eval_env_kwargs:
        sets["eval_env_kwargs"] = cfg.parse_set([item for group in known.eval_env_kwargs for item in group],
                                                "--eval-env-kwargs")
    if known.encoder:
        sets["encoder"] = known.encoder
    if known.encoder_kwargs:
        sets["encoder_kwargs"] = cfg.parse_set([item for group in known.encoder_kwargs for item in group],
                                               "--encoder-kwargs")
    if known.env_wrapper:
        sets["env_wrappers"] = wrapper_groups(known.env_wrapper)
    env = cfg.env_setting(known.env) if known.env else None
    from shoal.seeds import is_seeds_dir, read_seeds

    seeds_dir = Path(known.resume) if known.resume and is_seeds_dir(known.resume) else None
    if known.resume:
        from shoal.algorithm import config_from_dict

        if seeds_dir is not None:  # a directory of --seeds runs: their algorithm and settings
            algo_of, settings, _ = read_seeds(seeds_dir)
            saved = {"algo": algo_of, **settings}
        else:
            saved = trainer.read_run_config(known.resume)
        name = saved.pop("algo")
        if algo_name is not None and algos.get(algo_name).name != name:
            raise ShoalError(f"{known.resume} is a {name!r} run, not {algo_name!r}")
        base = config_from_dict(name, {**saved, **({"env": env} if env else {}), **sets}, "--resume")
    else:
        if algo_name is None:
            raise ShoalError("name an algorithm: shoal train ALGO --env ENV_ID (or --resume RUN_DIR); "
                             f"algorithms: {', '.join(sorted(algos.ALGOS))}")
        spec = algos.get(algo_name)
        name = spec.name
        base = cfg.build(spec.config_cls, name, env=env, file=known.config, sets=sets)
    cls = type(base)
    config = _parse(cls, rest, f"shoal train {name}", default=base,
                    description=TRAIN_HELP.format(algo=name.upper()))
    if known.n_jobs is not None and known.seeds is None and seeds_dir is None:
        raise ShoalError("--n-jobs runs --seeds' runs at once: give --seeds too (shoal tune takes --n-jobs for trials)")
    if seeds_dir is not None and known.seeds is None:  # each seed's run goes on, or starts if it never began
        from shoal.seeds import resume_seeds

        jobs = 1 if known.n_jobs is None else known.n_jobs
        total = len(read_seeds(seeds_dir)[2])
        return _report_seeds(config, resume_seeds, (seeds_dir, config), total, jobs, console)
    if known.seeds is not None:
        jobs = 1 if known.n_jobs is None else known.n_jobs
        return _train_seeds(config, known.seeds, rest, bool(known.resume), console, jobs)
    if known.resume:
        summary = trainer.resume(known.resume, config, console=console)
    else:
        summary = trainer.train(config, console=console)
    _print_summary(summary, console)
    return 0


def _train_seeds(config: Any, given: list[str], rest: list[str], resume: bool, console: Console,
                 jobs: int = 1) -> int:
    """``shoal train ... --seeds 0 1 2``: a run of ``config`` per seed (:func:`shoal.seeds.train_seeds`),
    each run's summary as it ends, then their final evaluations over the seeds."""
    from shoal import seeds as multi

    if resume:
        raise ShoalError("--seeds trains new runs: continue a directory of seeds with shoal train --resume DIR")
    if any(arg == "--seed" or arg.startswith("--seed=") for arg in rest):
        raise ShoalError("give --seed for one run or --seeds for several, not both")
    try:
        seeds = [int(s) for s in given]
    except ValueError:
        raise ShoalError(f"--seeds takes whole numbers, got {' '.join(given)}") from None
    return _report_seeds(config, multi.train_seeds, (config, seeds), len(seeds), jobs, console)


def _report_seeds(config: Any, run: Any, args: tuple, total: int, n_jobs: int, console: Console) -> int:
    """``run(*args, ...)`` (:func:`shoal.seeds.train_seeds` or ``resume_seeds``) of ``total`` seeds,
    saying what each seed's run does as it starts and ends, then their final evaluations over the
    seeds."""
    from shoal.evaluator import format_returns

    started: list[int] = []

    def starting(seed: int, run_dir: Path) -> None:
        started.append(seed)
        console.print(f"seed {seed} ({len(started)} of {total}): {run_dir}", highlight=False)

    def report(seed: int, summary: dict[str, Any], done: int) -> None:
        if n_jobs > 1:
            console.print(f"seed {seed} ({done} of {total} done):", highlight=False)
        _print_summary(summary, console)

    result = run(*args, n_jobs=n_jobs, console=console, report=report, starting=starting)
    seeds, runs = result["seeds"], result["runs"]
    mean, std, *each = format_returns(result["eval_return_mean"], result["eval_return_std"],
                                      *(r["eval_return_mean"] for r in runs))
    console.print((f"{len(seeds)} seeds: final eval return {mean} ± {std} over seeds (" if len(seeds) > 1
                   else f"1 seed: final eval return {mean} (")
                  + ", ".join(f"seed {seed}: {r}" for seed, r in zip(seeds, each))
                  + (f"; {result['solved']} of {len(seeds)} solved" if config.stop_return is not None else "")
                  + ")", highlight=False)
    if len(seeds) > 1:
        console.print(_iqm_line(result["eval_return_iqm"], *result["eval_return_iqm_ci"], "seeds"), highlight=False)
    console.print(f"plot of their mean: {result['plot']}", highlight=False)
    return 0


def _print_summary(s: dict[str, Any], console: Console) -> None:
    status = ("[green]solved[/green]" if s["solved"] else
              f"stopped at --stop-time-s ({s['wall_s']:.1f} s of wall time, start-up and evaluations included)"
              if s.get("timed_out") else
              f"stopped at --stop-episodes ({s['episodes']:,} training episodes)" if s.get("out_of_episodes") else
              f"stopped at --stop-patience (the last {s['patience']} evaluations were no better)" if s.get("stalled")
              else "done")
    from shoal.evaluator import format_returns

    success = f" (success {s['eval_success_rate']:.0%})" if s.get("eval_success_rate") is not None else ""
    mean, std, best = format_returns(s["eval_return_mean"], s["eval_return_std"], s["best_eval_return"])
    before = " (it had ended before: nothing left to train)" if s.get("ended_before") else ""
    console.print(f"{status}: eval return {mean} ± {std}{success} after {s['env_steps']:,} env steps in "
                  f"{s['elapsed_s']:.1f} s (best {best}){before}")
    console.print(f"run directory: {s['run_dir']}")
    console.print("  config.yaml  progress.csv  eval.csv  tb/  (tensorboard --logdir " + s["run_dir"] + "/tb)")
    console.print(f"  checkpoint:  {s['checkpoint']}")
    console.print(f"  plot:        {s['plot']}")
    if s.get("videos"):
        console.print(f"  videos:      {s['videos']}")
    if s.get("wandb"):
        console.print(f"  {s['wandb']}", markup=False, highlight=False)


@dataclass(frozen=True)
class EvalArgs:
    """Evaluate a trained policy: mean and std of episode returns, optionally videos."""

    path: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR_OR_CHECKPOINT")]
    """A run directory (its newest checkpoint) or a checkpoint directory."""
    best: bool = False
    """Evaluate the run's best checkpoint (the best evaluation so far) instead of its newest
    (rl-zoo's --load-best)."""
    episodes: int = 10
    """Number of episodes."""
    video: str | None = None
    """Write an mp4 of each episode into this directory."""
    render: bool = False
    """Show the episodes in a window as they are played, at the env's own frame rate (its 'human'
    render mode, as rl-zoo's enjoy); needs a display."""
    deterministic: bool = False
    """Take the most likely action. Without this or --stochastic, act as the run's own
    evaluations did (eval_deterministic, on unless the run turned it off)."""
    stochastic: bool = False
    """Sample actions (DQN: epsilon-greedy at the checkpoint's epsilon)."""
    seed: int = 0
    """Seed of the evaluation episodes."""
    max_steps: int = 10_000
    """Cut an episode that has not ended after this many steps (envs with no time limit)."""
    env: str | None = None
    """Evaluate on this env id instead of the run's (say, a local copy of the env a run trained on
    through env servers); its spaces must be the policy's."""
    env_kwargs: tuple[str, ...] | None = None
    """KEY=VALUE keyword arguments of the env's constructor instead of the run's env_kwargs (which
    apply to the run's own env id only): --env-kwargs is_slippery=true."""
    episode_info: tuple[str, ...] | None = None
    """Keys of the env's info at each episode's last step to report, as their mean over the
    episodes that gave a number (default: the run's --episode-info)."""

    # rl-zoo's enjoy and record_video flags, SB3's and shoal train's, as shoal eval names them (config.peer_hint)
    PEER_NAMES = {
        "load_best": ("rl-zoo's", {"best": ""}),
        "n_timesteps": ("rl-zoo's enjoy", {"episodes": " (it counts episodes, not steps)"}),
        "record_video": ("rl-zoo's", {"video": " DIR"}),
        "video_folder": ("rl-zoo's record_video", {"video": ""}),
        "n_eval_episodes": ("SB3's evaluate_policy", {"episodes": ""}),
        "eval_episodes": ("shoal train's", {"episodes": " here"}),
    }


def cmd_eval(argv: list[str], console: Console) -> int:
    from shoal import checkpoint as ckpt
    from shoal.config import SEED_LIMIT, check_episode_info
    from shoal.evaluator import format_returns
    from shoal.tuning import is_study

    args = _parse(EvalArgs, _gather(argv, "--env-kwargs"), "shoal eval")
    _check_flags(("--episodes", args.episodes, "at least 1"), ("--max-steps", args.max_steps, "at least 1"))
    if not 0 <= args.seed < SEED_LIMIT:
        raise ShoalError(f"--seed must be from 0 to {SEED_LIMIT - 1} (Gymnasium takes no negative seeds, torch "
                         f"none past 64 bits), got {args.seed}")
    if args.deterministic and args.stochastic:
        raise ShoalError("--deterministic and --stochastic exclude each other")
    check_episode_info(args.episode_info or (), "--episode-info")
    if args.video and args.render:
        raise ShoalError("--video and --render exclude each other: record the episodes, or watch them")
    where = Path(args.path)
    resolve = ckpt.resolve_best if args.best else ckpt.resolve
    runs = [] if is_study(where) else ckpt.runs_in(where)  # a study names its best trial instead
    if not runs:
        _evaluate_one(args, resolve(args.path), args.video, console)
        return 0
    # A directory of runs (`shoal train --seeds`' DIR, runs/): each run's newest (or best) checkpoint, then
    # their returns over the runs where they share an env
    means, envs = [], set()
    for run in runs:
        video = str(Path(args.video) / run.name) if args.video else None
        env_id, result = _evaluate_one(args, resolve(run), video, console)
        means.append(result["eval/return_mean"])
        envs.add(env_id)
    if len(envs) == 1:
        import numpy as np

        mean, std = format_returns(float(np.mean(means)), float(np.std(means)))
        console.print(f"{len(runs)} runs: return {mean} ± {std} over the runs' mean returns")
        if len(runs) > 1:
            from shoal.seeds import iqm_interval

            console.print(_iqm_line(*iqm_interval(means), "runs"), highlight=False)
    return 0


def _iqm_line(middle: float, low: float, high: float, what: str) -> str:
    """The interquartile mean of several runs' returns and its bootstrap interval, as one line."""
    from shoal.evaluator import format_returns

    middle_, low_, high_ = format_returns(middle, low, high)
    return f"  IQM {middle_}, 95% CI {low_} to {high_} (bootstrap over the {what}; rliable's interquartile mean)"


def _evaluate_one(args: EvalArgs, path, video: str | None, console: Console) -> tuple[str, dict]:
    """``shoal eval``'s episodes of one checkpoint, printed in a line: (env id, their statistics)."""
    from shoal import checkpoint as ckpt
    from shoal.algorithm import load_policy
    from shoal.envs import EnvOptions, env_spaces, is_remote, make_vector_env, policy_misfit
    from shoal.evaluator import format_returns, record_episodes, run_episodes, watch_episodes

    from shoal.config import eval_env_kwargs, parse_set

    env_id = args.env or ckpt.read_meta(path)["env"]
    policy = load_policy(path)
    run_kwargs = eval_env_kwargs(policy.config)  # as the run's evaluations made their envs
    if args.env_kwargs is not None:
        env_kwargs = parse_set(list(args.env_kwargs), "--env-kwargs")
    else:
        env_kwargs = run_kwargs if env_id == getattr(policy.config, "env", env_id) else {}
    if (video or args.render) and is_remote(env_id):
        what = "videos are rendered from" if video else "--render shows"
        raise ShoalError(f"{what} a local env: add --env ENV_ID (the run trained on env servers)")
    # The run's frame stack and mask source make its observations what the policy takes: any env it
    # is evaluated on here gets them too (an env server stacks its own: --frame-stack there)
    options = EnvOptions() if is_remote(env_id) else EnvOptions.of(policy.config)
    misfit = policy_misfit((policy.observation_space, policy.action_space), env_spaces(env_id, env_kwargs, options))
    if misfit:
        raise ShoalError(f"checkpoint {path} does not fit {env_id}: {misfit}")
    keys = tuple(getattr(policy.config, "episode_info", ()) if args.episode_info is None else args.episode_info)
    deterministic = args.deterministic or (not args.stochastic and policy.config.eval_deterministic)
    mode = "deterministic" if deterministic else "stochastic"
    if video:  # the statistics of the recorded episodes themselves: one pass, not two
        paths, result = record_episodes(policy.module, env_id, args.episodes, deterministic, args.seed,
                                        video, args.max_steps, env_kwargs, options, keys)
        console.print(f"wrote {len(paths)} video{'s' * (len(paths) != 1)} to {video}")
    elif args.render:
        result = watch_episodes(policy.module, env_id, args.episodes, deterministic, args.seed, args.max_steps,
                                env_kwargs, options, keys)
    else:
        envs = make_vector_env(env_id, args.episodes, env_kwargs, options)
        result = run_episodes(policy.module, envs, deterministic, args.seed, args.max_steps, args.episodes, keys)
    episodes = f"{args.episodes} episode{'s' * (args.episodes != 1)}"
    success = f"success {result['eval/success_rate']:.0%}; " if "eval/success_rate" in result else ""
    success += "".join(f"{key} {result[f'eval/{key}']:.4g}; " for key in keys if f"eval/{key}" in result)
    mean, std = format_returns(result["eval/return_mean"], result["eval/return_std"])
    console.print(f"{env_id}: return {mean} ± {std} "
                  f"over {episodes} ({mode}; {success}length {result['eval/length_mean']:.1f}; "
                  f"checkpoint {path}, policy version {policy.version})")
    return env_id, result


@dataclass(frozen=True)
class ExportArgs:
    """Write a trained policy's most likely actions as an ONNX model, for ONNX Runtime and other
    runtimes without Python (the README's "Deployment without Python" says what it takes and
    gives). The file is written once ONNX Runtime has given the policy's own actions on sample
    observations."""

    path: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR_OR_CHECKPOINT")]
    """A run directory (its newest checkpoint) or a checkpoint directory."""
    out: str = "policy.onnx"
    """The file to write."""
    best: bool = False
    """Export the run's best checkpoint (the best evaluation so far) instead of its newest."""


def cmd_export(argv: list[str], console: Console) -> int:
    from shoal import checkpoint as ckpt
    from shoal.algorithm import load_policy

    args = _parse(ExportArgs, argv, "shoal export")
    path = (ckpt.resolve_best if args.best else ckpt.resolve)(args.path)
    policy = load_policy(path)
    report = policy.export_onnx(args.out)
    show = lambda name, shape, dtype: f"{name} [N{''.join(f', {d}' for d in shape)}] {dtype}"  # noqa: E731
    inputs, outputs = (", ".join(show(name, *spec) for name, spec in report[k].items()) for k in ("inputs", "outputs"))
    console.print(f"wrote {report['path']} from checkpoint {path} (policy version {policy.version})\n"
                  f"  takes {inputs}\n  gives {outputs}\n"
                  f"  checked: ONNX Runtime gave the policy's own actions for {report['checked']} sample observations",
                  highlight=False)
    return 0


@dataclass(frozen=True)
class PlotArgs:
    """Plot learning curves of one or more runs, overlaid."""

    runs: Annotated[tuple[str, ...], tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR [RUN_DIR ...]")]
    """Run directories, or directories that hold runs (runs/: each run in it)."""
    out: str | None = None
    """Output PNG (default: RUN_DIR/curve.png for one run, DIR/curves.png for a directory of runs,
    curves.png for several)."""
    aggregate: bool = False
    """Runs of the same settings (other seeds) as one curve: the mean of their evaluations with a
    band of one standard deviation, each group labelled by the settings that differ."""
    stat: Literal["mean", "iqm"] = "mean"
    """With --aggregate, each group's curve: mean (± one standard deviation) or iqm (rliable's
    interquartile mean, with a 95% bootstrap band over the runs)."""
    metric: str | None = None
    """Draw this column of the runs' metrics instead of their returns: eval.csv's for eval/...
    (eval/length_mean, eval/success_rate, eval/KEY of --episode-info), else progress.csv's
    (episode/length_mean, loss/value, learner/approx_kl, ...)."""


def cmd_plot(argv: list[str], console: Console) -> int:
    from shoal.plot import plot_aggregate, plot_runs

    args = _parse(PlotArgs, argv, "shoal plot")
    if not args.runs:
        raise ShoalError("name at least one run directory: shoal plot RUN_DIR [RUN_DIR ...]")
    runs = []
    for run in map(Path, args.runs):
        if not run.is_dir():
            raise ShoalError(f"{run} is not a directory")
        held = [] if (run / "progress.csv").exists() else sorted(
            p for p in run.iterdir() if (p / "progress.csv").is_file())
        runs += held or [run]  # a directory of runs (runs/) stands for each run in it
    if args.out:
        out = args.out
    elif len(args.runs) == 1:
        out = str(Path(args.runs[0]) / ("curve.png" if runs == [Path(args.runs[0])] else "curves.png"))
    else:
        out = "curves.png"
    if args.aggregate:
        written = plot_aggregate(runs, out, args.metric or "eval/return_mean", args.stat)
    elif args.stat != "mean":
        raise ShoalError("--stat draws a group of runs: give --aggregate too")
    else:
        written = plot_runs(runs, out, args.metric)
    console.print(f"wrote {written}")
    return 0


def _asked_for_help(argv: list[str], command: str) -> bool:
    """For the listing commands: print the command's line of USAGE if asked for help."""
    if not (argv and argv[0] in ("-h", "--help")):
        return False
    line = next(line.strip() for line in USAGE.splitlines() if line.strip().startswith(command + " "))
    usage, summary = re.split(r"\s{2,}", line, maxsplit=1)
    print(f"usage: shoal {usage}\n\n{summary}")
    return True


def cmd_algos(argv: list[str], console: Console) -> int:
    from shoal.algos import ALGOS
    from shoal.config import preset_envs

    if _asked_for_help(argv, "algos"):
        return 0
    if argv:
        raise ShoalError(f"shoal algos takes no arguments, got {' '.join(argv)}")
    table = Table("algorithm", "description", "presets")
    for name, spec in sorted(ALGOS.items()):
        table.add_row(name, spec.summary, ", ".join(preset_envs(name)) or "-")
    console.print(table)
    return 0


def cmd_envs(argv: list[str], console: Console) -> int:
    import fnmatch

    import gymnasium as gym

    from shoal.algos import ALGOS
    from shoal.config import preset_envs
    from shoal.envs import import_env_packages

    if _asked_for_help(argv, "envs"):
        return 0
    if bad := [word for word in argv if word.startswith("-")]:
        raise ShoalError(f"shoal envs takes words to look for in env ids, not options: got {' '.join(bad)}")
    import_env_packages()
    presets = {name: preset_envs(name) for name in sorted(ALGOS)}  # ids, or patterns such as ALE/*
    ids = [env_id for env_id in sorted(gym.registry)
           if not argv or any(word.lower() in env_id.lower() for word in argv)]
    if not ids:
        raise ShoalError(f"no installed environment id contains {' or '.join(map(repr, argv))}: "
                         "shoal envs lists them all")
    table = Table("environment id", "presets")
    for env_id in ids:
        table.add_row(env_id, ", ".join(name for name, envs in presets.items()
                                        if any(fnmatch.fnmatchcase(env_id, p) for p in envs)))
    console.print(table)
    console.print("Any installed Gymnasium environment id works; 'presets' names the algorithms with shipped "
                  "tuned settings for it.")
    return 0


@dataclass(frozen=True)
class CheckEnvArgs:
    """Check that an environment is ready to train on, as stable-baselines3's check_env: Gymnasium's
    API checker, the spaces shoal's policies see and the algorithms that take them, and its step
    rate with random actions. For env servers (remote://HOST:PORT: `shoal serve-env`, or a
    simulator of yours behind proto/shoal.proto), the protocol's checks instead: every reply's
    arrays, seeded resets, bad actions refused. Exit status 0 when it passed, 1 when it did not."""

    env_id: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="ENV_ID")]
    """Environment id (module:EnvId imports module first, as `shoal train --env` does), or env
    servers: remote://HOST:PORT[,HOST:PORT...][/ENV_ID]."""
    env_kwargs: tuple[str, ...] = ()
    """KEY=VALUE keyword arguments of the env's constructor (values read as YAML)."""
    env_wrapper: tuple[str, ...] = ()
    """module:Name [KEY=VALUE ...]: a wrapper around the env, as a run's --env-wrapper (repeatable)."""
    seconds: float = 1.0
    """How long to step it with random actions."""


def cmd_check_env(argv: list[str], console: Console) -> int:
    from shoal.config import parse_set
    from shoal.envcheck import check_env
    from shoal.envs import is_remote, wrapper_pairs, wrapper_specs

    argv, wrappers = _take_wrappers(argv)
    args = _parse(CheckEnvArgs, _gather(argv, "--env-kwargs"), "shoal check-env")
    if not args.seconds >= 0:
        raise ShoalError(f"--seconds must be 0 or more, got {args.seconds}")
    remote = is_remote(args.env_id)
    if remote:
        if args.env_kwargs or wrappers:
            raise ShoalError("--env-kwargs and --env-wrapper are the env server's: give them to `shoal serve-env`")
        from shoal.envcheck import check_remote_env

        report = check_remote_env(args.env_id, args.seconds)
    else:
        report = check_env(args.env_id, parse_set(list(args.env_kwargs), "--env-kwargs"), args.seconds,
                           wrapper_pairs(wrapper_specs(wrappers)))
    console.print(f"[bold]{args.env_id}[/bold]", highlight=False)
    found = f"FAILED: {report.problem}" if report.problem else "passed"
    checker = "proto/shoal.proto's checks" if remote else "Gymnasium's env checker"
    console.print(f"  {checker}: {found}", markup=False, highlight=False)
    for line in report.remote:
        console.print(f"    {line}", markup=False, highlight=False)
    for warning in report.warnings:
        console.print(f"    warning: {warning}", markup=False, highlight=False)
    if report.spaces is not None:
        obs, actions = report.spaces
        console.print(f"  observations as shoal's policies take them: {obs}", markup=False, highlight=False)
        if getattr(obs, "images", ()):
            mask = f", the action mask's {obs.mask_dim} entries last" if obs.mask_dim else ""
            console.print(f"    a flat vector, the images' {obs.pixels} pixels first: each image goes through a "
                          f"convolutional encoder of its own, the rest beside them{mask}", markup=False,
                          highlight=False)
        console.print(f"  actions: {actions}", markup=False, highlight=False)
    takes = [name for name, reason in report.algorithms.items() if reason is None]
    console.print(f"  trains with: {', '.join(takes) or 'no algorithm'}", markup=False, highlight=False)
    refused: dict[str, list[str]] = {}  # one line per reason: an observation space none takes, say
    for name, reason in report.algorithms.items():
        if reason is not None:
            refused.setdefault(reason, []).append(name)
    for reason, names in refused.items():
        console.print(f"    not {', '.join(names)}: {reason}", markup=False, highlight=False)
    if report.hindsight is None:
        console.print("  a goal env: --her-goals relabels its transitions with hindsight goals (dqn, sac, td3, ddpg)",
                      markup=False, highlight=False)
    elif report.hindsight:
        console.print(f"  a goal env that --her-goals cannot relabel: {report.hindsight}", markup=False,
                      highlight=False)
    if report.step_failure:
        console.print(f"  random actions: FAILED after {report.steps:,} steps: {report.step_failure}", markup=False,
                      highlight=False)
    elif report.steps:
        ended = (f"{report.episodes:,} episodes ended, {report.steps / report.episodes:,.1f} steps each on average"
                 if report.episodes else "no episode ended")
        where = "over the wire" if remote else "in one process"
        console.print(f"  random actions: {report.steps_per_s:,.0f} steps/s {where} ({report.steps:,} steps; "
                      f"{ended})", markup=False, highlight=False)
    return 0 if report.ok else 1


@dataclass(frozen=True)
class ServeEnvArgs:
    """Serve copies of a Gymnasium env over gRPC (proto/shoal.proto); trainers use them with
    --env remote://HOST:PORT. Stop with Ctrl-C."""

    env_id: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="ENV_ID")]
    """Environment id served by default (any installed Gymnasium env)."""
    env_kwargs: tuple[str, ...] = ()
    """KEY=VALUE keyword arguments of ENV_ID's constructor, as gym.make takes them (values read as
    YAML): --env-kwargs is_slippery=false."""
    frame_stack: int | None = None
    """Serve the last N observations stacked together (as a run's --frame-stack stacks them; Atari
    games: 4 unless given), for every env id served."""
    info_action_mask: bool = False
    """Serve the legal actions, read from info["action_mask"], as each observation's mask (as a
    run's --info-action-mask)."""
    env_wrapper: tuple[str, ...] = ()
    """module:Name [KEY=VALUE ...]: a wrapper around every env served, as a run's --env-wrapper
    (repeatable, innermost first)."""
    num_envs: int = 8
    """Envs per client session, stepped together as one batch per request."""
    host: str = "127.0.0.1"
    """Address to bind; anything but loopback requires --token-file."""
    port: int = 50051
    """Port (0: any free port; the one chosen is printed)."""
    token_file: str | None = None
    """File holding the bearer token clients must send (at least 16 characters)."""
    tls_cert: str | None = None
    """PEM certificate chain for TLS (with --tls-key)."""
    tls_key: str | None = None
    """PEM private key for TLS."""
    allow: tuple[str, ...] = ()
    """Other env ids clients may open (an allowlist; the default id is always allowed)."""
    max_sessions: int = 16
    """Sessions (clients' vector envs) held at once; more are refused with RESOURCE_EXHAUSTED."""
    max_sessions_per_client: int | None = None
    """Sessions one client may hold at once (a client: the host its calls come from, whose runners
    and evaluator each open one), so that one cannot take them all; default: --max-sessions."""
    session_timeout_s: float = 300.0
    """Close a session idle for this long (a client that vanished)."""
    max_message_mb: float = 16.0
    """Largest request or reply, in MiB."""


def _gather(argv: list[str], flag: str) -> list[str]:
    """``--flag a --flag b`` as ``--flag a b``: a list flag given once per value takes them all
    (tyro alone keeps the last). Values run to the next option."""
    values: list[str] = []
    rest: list[str] = []
    given, taking = 0, False
    for arg in argv:
        if arg == flag:
            given, taking = given + 1, True
        elif arg.startswith(flag + "="):
            given, taking = given + 1, False
            values.append(arg.partition("=")[2])
        elif taking and not arg.startswith("-"):
            values.append(arg)
        else:
            taking = False
            rest.append(arg)
    return argv if given < 2 else [*rest, flag, *values]


def cmd_serve_env(argv: list[str], console: Console) -> int:
    from shoal.envs import EnvOptions, wrapper_pairs, wrapper_specs
    from shoal.remote.envserver import EnvServer
    from shoal.remote.server import read_token

    from shoal.config import parse_set

    argv, wrappers = _take_wrappers(argv)
    args = _parse(ServeEnvArgs, _gather(_gather(argv, "--allow"), "--env-kwargs"), "shoal serve-env")
    _check_flags(("--max-sessions", args.max_sessions, "at least 1"),
                 ("--max-sessions-per-client",
                  1 if args.max_sessions_per_client is None else args.max_sessions_per_client, "at least 1"),
                 ("--session-timeout-s", args.session_timeout_s, "positive"),
                 ("--max-message-mb", args.max_message_mb, "positive"))
    server = EnvServer(args.env_id, args.num_envs, allow=args.allow, max_sessions=args.max_sessions,
                       max_sessions_per_client=args.max_sessions_per_client,
                       env_kwargs=parse_set(list(args.env_kwargs), "--env-kwargs"),
                       env_options=EnvOptions(args.frame_stack, args.info_action_mask,
                                              wrapper_pairs(wrapper_specs(wrappers))),
                       session_timeout_s=args.session_timeout_s, host=args.host, port=args.port,
                       token=read_token(args.token_file), max_message_bytes=int(args.max_message_mb * 2**20),
                       tls_cert=args.tls_cert, tls_key=args.tls_key)
    made = "".join(f"{k}={v!r}, " for k, v in server.env_kwargs.items())
    made += f"frame stack {args.frame_stack}, " if args.frame_stack is not None else ""
    made += "action mask from info, " if args.info_action_mask else ""
    made += "".join(f"in {path}, " for path, _ in server.env_options.wrappers)
    where = _reachable(args.host, server)
    token = f"SHOAL_TOKEN_FILE={args.token_file} " if args.token_file else ""
    return _serve(server, console, f"serving {args.env_id} ({made}{args.num_envs} envs per session)",
                  f"  check it:    {token}shoal check-env remote://{where}\n"
                  f"  train on it: {token}shoal train ppo --env remote://{where}/{args.env_id}")


@dataclass(frozen=True)
class ServePolicyArgs:
    """Serve trained policies over gRPC (PolicyService in proto/shoal.proto): clients send
    observations and get actions, batched across clients. Stop with Ctrl-C."""

    paths: Annotated[tuple[str, ...], tyro.conf.Positional,
                     tyro.conf.arg(metavar="RUN_DIR_OR_CHECKPOINT [...]")]
    """Run directories (their newest checkpoint) or checkpoint directories."""
    policy_id: tuple[str, ...] = ()
    """An id for each path, in order (default: `default` for one path, else the directory names)."""
    best: bool = False
    """Serve each run's best checkpoint (the best evaluation so far) instead of its newest."""
    follow: bool = False
    """Swap in newer weights as they come: from the trainer's weight store while a run on the ray
    backend is going (each version the learner publishes), else each newer checkpoint. A run that
    has not written its first checkpoint yet is waited for."""
    max_batch: int = 64
    """Requests gathered into one forward pass, at most."""
    max_wait_ms: float = 2.0
    """How long the first request of a batch waits for others."""
    host: str = "127.0.0.1"
    """Address to bind; anything but loopback requires --token-file."""
    port: int = 50061
    """Port (0: any free port; the one chosen is printed)."""
    token_file: str | None = None
    """File holding the bearer token clients must send (at least 16 characters)."""
    tls_cert: str | None = None
    """PEM certificate chain for TLS (with --tls-key)."""
    tls_key: str | None = None
    """PEM private key for TLS."""
    max_message_mb: float = 16.0
    """Largest request or reply, in MiB."""
    device: str = "cpu"
    """Where the forward passes run: cpu, cuda, cuda:N or auto (a GPU pays for large networks
    and large batches)."""


def cmd_serve_policy(argv: list[str], console: Console) -> int:
    from shoal.remote.policyserver import PolicyServer
    from shoal.remote.server import read_token

    args = _parse(ServePolicyArgs, _gather(argv, "--policy-id"), "shoal serve-policy")
    if not args.paths:
        raise ShoalError("name at least one run directory or checkpoint: shoal serve-policy RUN_DIR")
    if args.policy_id and len(args.policy_id) != len(args.paths):
        raise ShoalError(f"give one --policy-id per path ({len(args.paths)}), got {len(args.policy_id)}")
    _check_flags(("--max-batch", args.max_batch, "at least 1"), ("--max-wait-ms", args.max_wait_ms, "at least 0"),
                 ("--max-message-mb", args.max_message_mb, "positive"))
    ids = args.policy_id or (("default",) if len(args.paths) == 1 else tuple(Path(p).name for p in args.paths))
    if len(set(ids)) != len(ids):
        raise ShoalError(f"policy ids must differ: {', '.join(ids)} (use --policy-id)")
    if args.best and args.follow:
        raise ShoalError("--best serves each run's best checkpoint as it is now, and --follow swaps in newer "
                         "weights as they come: give one of them")
    if args.follow:
        _wait_for_first_checkpoints(args.paths, console)
    from shoal import checkpoint as ckpt

    paths = [str(ckpt.resolve_best(p)) for p in args.paths] if args.best else list(args.paths)
    server = PolicyServer(dict(zip(ids, paths)), follow=args.follow, max_batch=args.max_batch,
                          max_wait_ms=args.max_wait_ms, host=args.host, port=args.port,
                          token=read_token(args.token_file), max_message_bytes=int(args.max_message_mb * 2**20),
                          tls_cert=args.tls_cert, tls_key=args.tls_key, device=args.device)
    versions = ", ".join(f"{pid} (version {p.version})" for pid, p in server.policies.items())
    where = _reachable(args.host, server)
    return _serve(server, console, f"serving {versions}" + (", following their runs" if args.follow else ""),
                  f"  clients: shoal.PolicyClient({where!r}).act(obs) in Python, or proto/shoal.proto's "
                  "PolicyService in any language (examples/node_simulator/play.js)")


def _wait_for_first_checkpoints(paths: tuple[str, ...], console: Console, poll_s: float = 1.0) -> None:
    """`serve-policy --follow` of a local run started a moment ago: wait (saying so once) until each
    run has written a checkpoint to serve. A ray run's weight store is followed from the start."""
    import time

    from shoal import checkpoint as ckpt
    from shoal.rundir import LIVE

    for path in paths:
        said = False
        while not (Path(path) / LIVE).is_file():
            try:
                ckpt.resolve(path)
                break
            except ckpt.CheckpointPending as e:
                if not said:
                    console.print(f"waiting for the first checkpoint of {path}: {e.when}; Ctrl-C stops",
                                  highlight=False)
                    sys.stdout.flush()
                    said = True
                time.sleep(poll_s)


def _reachable(host: str, server: Any) -> str:
    """The address clients reach ``server`` at: a server bound to every address leaves the host to
    the user (THIS_HOST)."""
    return server.address if host not in ("0.0.0.0", "::", "[::]") else f"THIS_HOST:{server.server.port}"


def _serve(server: Any, console: Console, what: str, then: str = "") -> int:
    """Run a server until Ctrl-C or SIGTERM, then stop it gracefully. ``what`` it serves, and
    ``then`` what to do with it, are said once it listens."""
    import signal
    import threading

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    auth = "token required" if server.server.token else "no token"
    console.print(f"{what} on {server.address} ({auth}); Ctrl-C stops", highlight=False)
    if then:
        console.print(then, highlight=False, markup=False)
    sys.stdout.flush()
    stop.wait()
    server.stop(grace=2.0)
    console.print("stopped", highlight=False)
    return 0


@dataclass(frozen=True)
class TuneArgs:
    """Search an algorithm's settings with Optuna, as rl-baselines3-zoo's --optimize does: each trial
    a whole run in a directory of its own, its settings drawn by the TPE sampler (--sampler), pruned by
    the median of the earlier trials at each evaluation (--pruner), its value the final evaluation's
    mean return.
    Writes study.db (Optuna's SQLite storage), trials.csv and best.yaml (train with it: shoal train
    ALGO --env ENV --config best.yaml) in the study directory. The same command with the same
    --study-dir runs more trials of the study."""

    algo: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="ALGO")]
    """Algorithm to tune (`shoal algos` lists them)."""
    env: str
    """Gymnasium environment id to tune it on."""
    trials: int = 20
    """Trials to run (this many more, in a study that has some)."""
    total_steps: int | None = None
    """Env steps of each trial (default: the preset's total_steps)."""
    evaluations: int = 5
    """Evaluations in each trial, each reported to the pruner; the last gives the trial's value."""
    param: tuple[str, ...] = ()
    """NAME=SPEC settings to search, instead of the algorithm's default space: log(A, B) (log-uniform),
    float(A, B), int(A, B), or a YAML list of choices: --param 'lr=log(1e-5, 1e-2)' 'hidden_sizes=[[64, 64],
    [256, 256]]'."""
    set: tuple[str, ...] = ()
    """KEY=VALUE settings every trial has (values read as YAML), as shoal train's --set."""
    config: str | None = None
    """A YAML file of settings every trial has, as shoal train's --config."""
    env_kwargs: tuple[str, ...] = ()
    """KEY=VALUE keyword arguments of the env's constructor, as shoal train's."""
    study_dir: str | None = None
    """Where the study is written (default runs/tune-ALGO-ENV-TIME); one that holds a study gets more trials."""
    seed: int = 0
    """Seed of the sampler and of every trial's run (the same for all: their settings differ, not their luck)."""
    startup_trials: int = 5
    """Trials drawn at random before TPE models the results, and before the pruner prunes."""
    sampler: Literal["tpe", "random"] = "tpe"
    """What draws each trial's settings: tpe (Optuna's TPE, after --startup-trials random ones) or
    random (rl-zoo's --sampler)."""
    prune: bool = True
    """End trials early at an evaluation, as --pruner judges them (--no-prune: run every trial to its end)."""
    pruner: Literal["median", "halving", "hyperband"] = "median"
    """median: below the median of the earlier trials at that step, after --startup-trials complete
    ones and a third of the steps; halving (successive halving, rl-zoo's): outside the best third at
    each rung (the first evaluation's steps times 1, 3, 9, ...); hyperband: several such halvings,
    each starting at a later rung."""
    timeout_s: float | None = None
    """Start no trial after this many seconds of the study."""
    n_jobs: int = 1
    """Trials run at once, each in a process of its own sharing the study (rl-zoo's --n-jobs); give
    each the cores its run uses (--torch-threads, 1 by default, and its envs)."""
    metric: str = "eval/return_mean"
    """The evaluations' column a trial is judged by, its final evaluation's (and each evaluation's,
    for the pruner): eval/return_mean, eval/success_rate, eval/KEY of --set episode_info=[KEY]."""
    direction: str = "maximize"
    """maximize or minimize --metric."""

    # rl-zoo's --optimize flags and shoal train's, as shoal tune names them (config.peer_hint)
    PEER_NAMES = {
        "n_trials": ("rl-zoo's", {"trials": ""}),
        "n_startup_trials": ("rl-zoo's", {"startup_trials": ""}),
        "n_evaluations": ("rl-zoo's", {"evaluations": ""}),
        "storage": ("rl-zoo's", {"study_dir": " (its study.db is Optuna's SQLite storage)"}),
        "study_name": ("rl-zoo's", {"study_dir": " (a study is its directory)"}),
        "run_dir": ("shoal train's", {"study_dir": " here (each trial's run is a directory in it)"}),
    }


def cmd_tune(argv: list[str], console: Console) -> int:
    from shoal.config import parse_set
    from shoal.tuning import tune

    for flag in ("--param", "--set", "--env-kwargs"):
        argv = _gather(argv, flag)
    args = _parse(TuneArgs, argv, "shoal tune")
    params = {}
    for item in args.param:
        name, sep, spec = item.partition("=")
        if not sep or not name.strip():
            raise ShoalError(f"--param expects NAME=SPEC (log(A, B), float(A, B), int(A, B) or [choices]), "
                             f"got {item!r}")
        params[name.strip()] = spec
    sets = parse_set(list(args.set))
    if args.env_kwargs:
        sets["env_kwargs"] = parse_set(list(args.env_kwargs), "--env-kwargs")
    _check_flags(("--trials", args.trials, "at least 1"), ("--evaluations", args.evaluations, "at least 1"),
                 ("--startup-trials", args.startup_trials, "at least 0"), ("--n-jobs", args.n_jobs, "at least 1"),
                 *([("--total-steps", args.total_steps, "at least 1")] if args.total_steps is not None else []),
                 *([("--timeout-s", args.timeout_s, "positive")] if args.timeout_s is not None else []))
    study = tune(args.algo, args.env, trials=args.trials, params=params or None, total_steps=args.total_steps,
                 evaluations=args.evaluations, sets=sets, config_file=args.config, study_dir=args.study_dir,
                 seed=args.seed, startup_trials=args.startup_trials, prune=args.prune, timeout_s=args.timeout_s,
                 n_jobs=args.n_jobs, metric=args.metric, direction=args.direction, sampler=args.sampler,
                 pruner=args.pruner, console=console)
    if study.best_value is None:
        return 1
    console.print(f"train with them: shoal train {args.algo} --env {args.env} --config {study.study_dir / 'best.yaml'}",
                  markup=False, highlight=False)
    return 0


COMMANDS = {"train": cmd_train, "serve-env": cmd_serve_env, "serve-policy": cmd_serve_policy, "eval": cmd_eval,
            "export": cmd_export, "plot": cmd_plot, "algos": cmd_algos, "envs": cmd_envs, "check-env": cmd_check_env,
            "tune": cmd_tune}

# Commands as rl-baselines3-zoo and RLlib's CLI name them, and shoal's for them.
PEER_COMMANDS = {
    "enjoy": "rl-zoo's enjoy is `shoal eval RUN_DIR --render` (a window; --video DIR writes mp4s)",
    "record-video": "rl-zoo's record_video is `shoal eval RUN_DIR --video DIR`",
    "evaluate": "`shoal eval RUN_DIR` evaluates a run",
    "rollout": "RLlib's rollout is `shoal eval RUN_DIR`",
    "resume": "`shoal train --resume RUN_DIR` resumes a run",
    "serve": "`shoal serve-policy RUN_DIR` serves a policy (`shoal serve-env ENV_ID` serves envs)",
    "optimize": "rl-zoo's --optimize is `shoal tune ALGO --env ENV_ID`",
    "list": "`shoal algos` and `shoal envs` list what there is",
}


def algorithm_names() -> set[str]:
    """The algorithms' names without importing them (and torch): each is its module's in shoal/algos."""
    return {path.stem for path in (Path(__file__).parent / "algos").glob("*.py") if path.stem != "__init__"}


def unknown_command(name: str) -> str:
    """The line for a command shoal does not have: a peer's name for one of shoal's, an algorithm
    given as the command (train it), or the nearest command's name."""
    import difflib

    key = name.lower().replace("_", "-")
    if key in PEER_COMMANDS:
        hint = f": {PEER_COMMANDS[key]}"
    elif key in algorithm_names():
        hint = f": train it with `shoal train {key} --env ENV_ID`"
    else:
        close = difflib.get_close_matches(key, list(COMMANDS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown command {name!r}{hint}; choose from {', '.join(COMMANDS)}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``shoal`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out, err = Console(soft_wrap=True), Console(stderr=True, soft_wrap=True)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command = COMMANDS.get(argv[0])
    if command is None:
        err.print(f"shoal: error: {unknown_command(argv[0])}", highlight=False, markup=False, soft_wrap=True)
        return 2
    try:
        return command(argv[1:], out if argv[0] != "train" else err)
    except ShoalError as e:
        from shoal.trainer import Interrupted

        err.print(f"shoal: error: {e}", highlight=False, markup=False, soft_wrap=True)
        return 130 if isinstance(e, Interrupted) else 2
    except KeyboardInterrupt:
        err.print("shoal: interrupted", highlight=False)
        return 130
    except BrokenPipeError:
        if not _reader_gone(sys.stdout):  # a pipe of the run's own (a socket, a subprocess) is a real error
            raise
        # `shoal train ppo --help | head`: the reader left. Say nothing more, and point stdout at
        # /dev/null, or the interpreter's own flush at exit fails again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a writer stopped by SIGPIPE (128 + 13)


def _reader_gone(stream: Any) -> bool:
    """Whether ``stream`` is a pipe whose reading end has been closed."""
    import select

    try:
        poll = select.poll()
        poll.register(stream.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


if __name__ == "__main__":
    sys.exit(main())
