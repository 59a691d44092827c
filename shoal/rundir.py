"""The run directory: resolved config, metrics (CSV and TensorBoard), checkpoints, plots.

Every file is either appended a whole row at a time or replaced atomically, so a run stopped at
any moment leaves a directory that can be read, plotted and resumed.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from shoal.config import to_dict
from shoal.envs import file_name
from shoal.errors import ShoalError
from shoal.plot import read_rows


LIVE = "live.json"  # a running trainer's weight store, while it runs (ray backend)
LOCK = ".lock"  # flocked by the trainer writing the directory; holds its pid


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


class CsvLog:
    """A CSV file of metric rows; when a row brings new columns, the file is rewritten atomically."""

    def __init__(self, path: Path):
        self.path = path
        self.fields: list[str] = []
        if path.exists():
            self.rows()  # a file this class cannot append to is refused now, before a run writes
            with open(path, newline="", encoding="utf-8") as f:
                self.fields = next(csv.reader(f), [])

    def rows(self) -> list[dict[str, str]]:
        """All rows written so far."""
        if not self.path.exists():
            return []
        return read_rows(self.path)

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=self.fields)
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(self.path, buf.getvalue())

    def write(self, row: dict[str, Any]) -> None:
        """Append one row."""
        new = [k for k in row if k not in self.fields]
        if new or not self.path.exists():
            old = self.rows()
            self.fields += new
            self._rewrite([*old, row])
            return
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.fields).writerow(row)

    def truncate_after(self, env_steps: int) -> None:
        """Drop rows logged after ``env_steps`` (on resume, they will be logged again)."""
        rows = self.rows()
        kept = [r for r in rows if float(r.get("env_steps") or 0) <= env_steps]
        if len(kept) != len(rows):
            self._rewrite(kept)


class RunDir:
    """Creates and writes a run directory."""

    def __init__(self, path: str | Path, tensorboard: bool = True):
        self.path = Path(path)
        # what this run creates, innermost first: the directory (when new), and parents such as
        # runs/; a run that fails to start removes them again
        self.made = [p for p in (self.path, *self.path.parents) if not p.exists()]
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / f".write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise ShoalError(f"cannot write the run directory {self.path}: {e.strerror} "
                             "(choose another with --run-dir)") from None
        self._lock = self._take_lock()
        self.checkpoints = self.path / "checkpoints"
        self.progress = CsvLog(self.path / "progress.csv")
        self.evals = CsvLog(self.path / "eval.csv")
        self._tb = None
        self._use_tb = tensorboard
        self.wandb: Any = None  # a WandbRun, once track() starts one

    def _take_lock(self) -> Any:
        """One trainer per run directory: two (a resume started while the run goes on) would
        interleave their rows and checkpoints. An flock, so a killed trainer's lock goes with it."""
        f = open(self.path / LOCK, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise ShoalError(f"{self.path} is in use by another shoal trainer (pid {holder}); one run directory "
                             "takes one trainer at a time") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        return f

    def track(self, algo: str, config: Any) -> None:
        """Start (or, for a resumed run, go on with) the run's W&B run, where config.wandb_project asks for one."""
        if config.wandb_project is not None:
            from shoal.tracking import WandbRun

            self.wandb = WandbRun(self.path, algo, config)

    def release(self, failed: bool = False) -> None:
        """Let another trainer take the directory (this one has finished with it); its W&B run ends,
        marked failed where ``failed``."""
        self.close()
        if self.wandb is not None:
            self.wandb.finish(failed)
            self.wandb = None
        if self._lock is not None:
            self._lock.close()  # closing the file drops its flock
            self._lock = None

    @staticmethod
    def default_path(algo: str, env: str, seed: int, tag: str | None = None) -> Path:
        """runs/ALGO-ENV-YYYYmmdd-HHMMSS-sSEED (or -TAG), unique."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = Path("runs") / f"{algo}-{file_name(env)}-{stamp}-{tag or f's{seed}'}"
        path, i = base, 1
        while path.exists():
            path, i = base.with_name(f"{base.name}-{i}"), i + 1
        return path

    def write_config(self, algo: str, config: Any) -> None:
        """The resolved config, with the algorithm name, as YAML."""
        text = yaml.safe_dump({"algo": algo, **to_dict(config)}, sort_keys=False)
        atomic_write_text(self.path / "config.yaml", text)

    def mark_live(self, store: dict[str, Any] | None) -> None:
        """Name the running trainer's weight store (ray backend) in ``live.json``, for
        ``shoal serve-policy --follow``; nothing for a store that lives in the trainer's process."""
        if store is not None:
            atomic_write_text(self.path / LIVE, json.dumps(store))

    def clear_live(self) -> None:
        """The run's store is gone: followers fall back to its checkpoints."""
        (self.path / LIVE).unlink(missing_ok=True)

    def log(self, metrics: dict[str, Any], evaluation: bool = False) -> None:
        """One row of training (or evaluation) metrics, to CSV, TensorBoard and W&B."""
        (self.evals if evaluation else self.progress).write(metrics)
        if self.wandb is not None:
            self.wandb.log(metrics)
        if self._use_tb:
            writer, step = self._writer(), int(metrics["env_steps"])
            for key, value in metrics.items():
                if key not in ("iteration", "env_steps") and isinstance(value, (int, float)):
                    writer.add_scalar(key, value, step)

    def _writer(self) -> Any:
        """The run's TensorBoard writer, opened at its first use."""
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.path / "tb"))
        return self._tb

    def log_video(self, path: Path, env_steps: int) -> None:
        """A video the run recorded (RUN_DIR/videos/...): to TensorBoard as an animated GIF (its
        images tab plays them; torch's add_video needs moviepy 1, and the GIF is what it would
        write), and to W&B where the run is tracked."""
        if self._use_tb:
            from tensorboard.compat.proto.summary_pb2 import Summary

            from shoal.evaluator import gif_of

            gif, width, height = gif_of(path)
            image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif)
            self._writer()._get_file_writer().add_summary(Summary(value=[Summary.Value(tag="video", image=image)]),
                                                           env_steps)
        if self.wandb is not None:
            self.wandb.log_video(path, env_steps)

    def discard(self) -> None:
        """Undo a run that never got going (nothing in it is worth keeping): delete the directory
        if this run created it (and the parents it created, while empty), else what it wrote
        there, so the same --run-dir can be used again."""
        self.release(failed=True)
        if self.made:  # made[0] is the directory itself: its parents all existed if it did
            shutil.rmtree(self.path, ignore_errors=True)
            for parent in self.made[1:]:
                try:
                    parent.rmdir()  # only while empty: another run's directory keeps it
                except OSError:
                    break
            return
        for name in ("config.yaml", LIVE, LOCK):
            (self.path / name).unlink(missing_ok=True)

    def close(self) -> None:
        """Flush TensorBoard."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
