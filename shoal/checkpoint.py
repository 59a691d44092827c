"""Checkpoints: written atomically, found by recency, refused when they do not fit.

A checkpoint is a directory with three files:
- ``policy.pt``: config, spaces and policy weights; plain tensors and strings, so deployment
  loads it with ``torch.load(weights_only=True)`` and runs no pickled code.
- ``state.pt``: everything resuming needs (optimiser, counters, RNG, envs mid-episode). It is
  pickled: load only checkpoints you wrote yourself.
- ``meta.json``: algorithm, env, counters, for listing and quick checks.

It is written into a temporary sibling and renamed into place, so a directory with the final
name is always complete; a kill mid-write leaves only a ``.tmp`` directory, ignored and cleaned.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from shoal.errors import ShoalError

POLICY_FILE, STATE_FILE, META_FILE = "policy.pt", "state.pt", "meta.json"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(path: Path, policy: dict[str, Any], state: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write a checkpoint directory at ``path`` atomically (replacing a checkpoint already there,
    and nothing else: a file or a directory holding other things is refused, never deleted)."""
    path = Path(path)
    if path.exists() and not (is_checkpoint(path) or (path.is_dir() and not any(path.iterdir()))):
        what = "a directory that holds other things" if path.is_dir() else "a file"
        raise ShoalError(f"cannot write a checkpoint at {path}: it is {what}, which a checkpoint (a directory "
                         "of its own) would replace; give a new path, or one of an older checkpoint")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        torch.save(policy, tmp / POLICY_FILE)
        torch.save(state, tmp / STATE_FILE)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        for name in (POLICY_FILE, STATE_FILE, META_FILE):
            with open(tmp / name, "rb") as f:
                os.fsync(f.fileno())
    except OSError as e:  # unwritable, or the disk filled up: nothing half-written is left
        shutil.rmtree(tmp, ignore_errors=True)
        where = f" ({e.filename})" if e.filename and Path(e.filename) in path.parents else ""
        raise ShoalError(f"cannot write a checkpoint at {path}: {e.strerror or e}{where}") from None
    if path.exists():  # e.g. "best": move the old one aside first, then swap in the new one
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, path)
    _fsync_dir(path.parent)
    return path


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a complete checkpoint directory."""
    return all((Path(path) / f).is_file() for f in (POLICY_FILE, STATE_FILE, META_FILE))


def checkpoints_in(run_dir: Path) -> list[Path]:
    """Complete periodic checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    found = [p for p in root.glob("ckpt_*") if is_checkpoint(p)] if root.is_dir() else []
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def runs_in(path: Path) -> list[Path]:
    """The run directories (each with its config.yaml) directly inside ``path``, by name: a
    ``runs/`` directory, ``shoal train --seeds``' directory, a study's trials. None where ``path``
    is a run itself."""
    p = Path(path)
    if (p / "config.yaml").is_file() or not p.is_dir():
        return []
    return sorted(d for d in p.iterdir() if (d / "config.yaml").is_file())


def runs_held(path: Path) -> str:
    """For a command that takes one run: "PATH holds N runs, not a run: give one of them (...)"
    where ``path`` is a directory of runs, else ''."""
    held = runs_in(path)
    if not held:
        return ""
    names = ", ".join(r.name for r in held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
    return f"{path} holds {len(held)} run{'s' * (len(held) != 1)}, not a run: give one of them ({names})"


class CheckpointPending(ShoalError):
    """A run directory whose run has not written a checkpoint yet; ``when`` says when it will."""

    def __init__(self, message: str, when: str):
        super().__init__(message)
        self.when = when


def resolve(path: str | Path) -> Path:
    """A checkpoint directory from a checkpoint or run directory (or the run's ``checkpoints``
    directory): the run's newest periodic checkpoint, or its ``best`` when it stopped before
    writing a periodic one."""
    p = Path(path)
    if not p.exists():
        raise ShoalError(f"{p} does not exist: give a run directory or a checkpoint directory")
    if is_checkpoint(p):
        return p
    if p.name == "checkpoints" and not (p / "checkpoints").is_dir():  # a run's checkpoints directory: its run's
        p = p.parent
    found = checkpoints_in(p)
    if found:
        return found[-1]
    if is_checkpoint(p / "checkpoints" / "best"):
        return p / "checkpoints" / "best"
    if (p / "config.yaml").is_file():  # a run directory whose run has not checkpointed yet
        from shoal.config import read_yaml

        try:
            interval = f"{int(read_yaml(p / 'config.yaml')['checkpoint_interval']):,}"
        except (ShoalError, KeyError, TypeError, ValueError):
            interval = "checkpoint_interval"
        when = (f"its run writes one every {interval} env steps, its best at the first evaluation that sets one, "
                "and a last one when it ends")
        raise CheckpointPending(f"no complete checkpoint in {p} yet (looked in {p / 'checkpoints'}): {when}; try "
                                "again then", when)
    from shoal.tuning import best_trial_dir, is_study

    if is_study(p):  # its trials are the runs
        trial = best_trial_dir(p)
        raise ShoalError(f"{p} is a shoal tune study, not a run: give one of its trials, "
                         + (f"its best is {trial}" if trial else f"{p}/trial_NNNN (its trials.csv lists them)"))
    raise ShoalError(runs_held(p) or f"no complete checkpoint in {p} (looked in {p / 'checkpoints'})")


def resolve_best(path: str | Path) -> Path:
    """The ``best`` checkpoint of a run directory (or of its ``checkpoints`` directory): the one
    with the best evaluation return so far (rl-zoo's --load-best)."""
    p = Path(path)
    if p.name == "checkpoints" and not (p / "checkpoints").is_dir():
        p = p.parent
    if is_checkpoint(p / "checkpoints" / "best"):
        return p / "checkpoints" / "best"
    if is_checkpoint(p):
        raise ShoalError(f"--best takes a run directory, and {p} is a checkpoint: give its run's directory, or "
                         "leave --best out to use this checkpoint")
    if not (p / "config.yaml").is_file():
        resolve(p)  # says what p is instead: missing, a study, a directory of runs
    raise ShoalError(f"{p} holds no best checkpoint yet: its run writes one at the first evaluation")


def _read(path: Path, name: str, reader: Any) -> Any:
    """``reader(file)`` for a checkpoint's file, or a ShoalError naming it. Checkpoints are written
    whole, so a file that cannot be read was damaged since (a copy cut short, a disk error) or
    comes from elsewhere: say which, and how to go on, instead of torch's or json's traceback."""
    file = Path(path) / name
    try:
        return reader(file)
    except Exception as e:  # json's, pickle's, torch's zip reader's, a decoder's: each its own type
        detail = (str(e).strip().splitlines() or [""])[0].split(". ")[0][:160]  # its first sentence
        raise ShoalError(f"checkpoint {path}: {name} cannot be read ({type(e).__name__}: {detail}); it was damaged "
                         f"after it was written, or is not shoal's: delete that checkpoint directory to use the one "
                         f"before it") from None


def read_meta(path: Path) -> dict[str, Any]:
    """The meta.json of a checkpoint."""
    return _read(path, META_FILE, lambda f: json.loads(f.read_text(encoding="utf-8")))


def read_policy(path: Path) -> dict[str, Any]:
    """The deployment payload of a checkpoint, loaded without running pickled code (onto the CPU:
    learners hand back CPU state, and checkpoints from before --device are read the same way)."""
    return _read(path, POLICY_FILE, lambda f: torch.load(f, weights_only=True, map_location="cpu"))


def read_state(path: Path) -> dict[str, Any]:
    """The full training state of a checkpoint (pickled: your own checkpoints only)."""
    return _read(path, STATE_FILE, lambda f: torch.load(f, weights_only=False, map_location="cpu"))


def prune(run_dir: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest periodic checkpoints, and stale temporary ones."""
    for old in checkpoints_in(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    root = Path(run_dir) / "checkpoints"
    for stale in root.glob(".*.tmp-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
