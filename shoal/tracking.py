"""Weights & Biases tracking of a run (``--wandb-project``): its settings, the rows it writes to
progress.csv and eval.csv, and its videos, in one W&B run that a resume goes on with.

W&B keeps its files in ``RUN_DIR/wandb`` (all of them, with WANDB_MODE=offline, for ``wandb
sync``), and the run's W&B id in ``RUN_DIR/wandb_id``.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from pathlib import Path
from typing import Any

from shoal.config import to_dict
from shoal.errors import ShoalError

ID_FILE = "wandb_id"
STEP = "env_steps"  # every metric is charted against the run's env steps, as its CSV rows are


class WandbRun:
    """One shoal run's W&B run."""

    def __init__(self, path: Path, algo: str, config: Any):
        from shoal.rundir import atomic_write_text

        self._wandb = wandb = require_wandb()
        id_file = path / ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(6)
        try:
            # silent: shoal says where the run is, in one line, beside its progress bar
            self.run = wandb.init(project=config.wandb_project, entity=config.wandb_entity,
                                  group=config.wandb_group, tags=list(config.wandb_tags), name=path.name,
                                  id=run_id, resume="allow",
                                  dir=str(path.resolve()), settings=wandb.Settings(console="off", silent=True))
        except wandb.errors.Error as e:
            raise ShoalError(f"Weights & Biases could not start the run ({e}); or set WANDB_MODE=offline to keep "
                             "it in the run directory for `wandb sync`") from None
        self.run.config.update({"algo": algo, **to_dict(config)}, allow_val_change=True)
        self.run.define_metric(STEP)
        self.run.define_metric("*", step_metric=STEP)
        atomic_write_text(id_file, run_id)

    @property
    def where(self) -> str:
        """The run's page, or for an offline run its files and how to upload them."""
        if self.run.settings.mode == "disabled":
            return "W&B: disabled (WANDB_MODE=disabled): nothing is sent"
        if self.run.offline:
            files = os.path.relpath(self.run.settings.sync_dir)
            return f"W&B (offline): {files} (upload with `wandb sync {files}`)"
        return f"W&B: {self.run.url}"

    def log(self, metrics: dict[str, Any]) -> None:
        """A row of metrics; ``env_steps`` among them places it."""
        self.run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float)) and k != "iteration"})

    def log_video(self, path: Path, env_steps: int) -> None:
        """A --video-interval video, at the env steps it was recorded."""
        self.run.log({"video": self._wandb.Video(str(path), format="mp4"), STEP: env_steps})

    def finish(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def require_wandb() -> Any:
    """The wandb module, or the one line that says how to install it."""
    try:
        import wandb
    except ImportError:
        raise ShoalError("--wandb-project tracks the run in Weights & Biases, which is not installed: "
                         "pip install 'shoal[wandb]'") from None
    return wandb


def grouped(config: Any, group: str) -> Any:
    """``config`` with ``group`` as its W&B group, where it is tracked and names none of its own
    (the runs of one --seeds or shoal tune directory)."""
    if config.wandb_project is None or config.wandb_group is not None:
        return config
    return dataclasses.replace(config, wandb_group=group)
