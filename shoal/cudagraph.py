"""``--cuda-graph``: a learner's gradient update recorded once as a CUDA graph and replayed.

SAC's update on 256-wide layers is many small kernels (three networks forward and back, the
fused Adam step, the target critics' Polyak average). On a GPU each costs more to launch from
Python than to run, so the update is bound by the host, not the GPU (BENCHMARKS.md, "Learners on
a GPU"). A CUDA graph records those launches once and replays them all with one call: the batch
is copied into the graph's own input tensors first, and its outputs are read back after. LeanRL
(CleanRL's fast variants, through TorchRL's ``CudaGraphModule``) does the same. On an H200,
SAC's updates ran 10.7x as fast with it (2,188 a second against 205; SB3's 90).

What a graph fixes at capture, and how each stays right here:

- the tensors it reads and writes: the parameters, Adam's moments and steps, the targets, the
  batch's inputs. Parameters are updated in place; a checkpoint loaded into the learner replaces
  Adam's state tensors, so the learner drops its graph then (:meth:`GraphedUpdate.reset`) and
  records another;
- the learning rate, a number baked into each kernel: the graph is recorded with each parameter
  group's rate as a tensor on the GPU, which is refilled before a replay when the schedule has
  changed it;
- random draws: the learner's generator is registered with the graph, so each replay advances it
  as the eager update would, and a checkpoint's generator state carries over;
- the batch's shape: a batch of another shape (none in shoal's loops, whose batches are
  ``batch_size`` rows) runs eagerly.

The first ``warmup`` updates run eagerly on a side stream, as torch's documentation asks (they
create Adam's state and the libraries' workspaces); the next is recorded, then replayed for its
own batch. Where recording fails, a warning names the cause and the run goes on eagerly.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
from torch import Tensor

from shoal.replay import Transitions

log = logging.getLogger(__name__)


class GraphedUpdate:
    """``step(batch) -> (metrics, td or None)`` (an off-policy learner's ``train_batch``) replayed
    from a CUDA graph; ``optimizers`` and ``generator`` are those ``step`` uses."""

    def __init__(self, step: Callable[[Transitions], tuple[dict[str, Tensor], Tensor | None]],
                 optimizers: Callable[[], list[torch.optim.Optimizer]], generator: torch.Generator,
                 warmup: int = 3):
        self.step, self.optimizers, self.generator = step, optimizers, generator
        self.eager_left = warmup  # eager updates before the recording
        self.failed: str | None = None  # why recording failed, if it did: every update is eager then
        self.reset()

    def reset(self) -> None:
        """Forget the graph (the tensors it holds were replaced: a checkpoint loaded); the next
        update after one eager one records another."""
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: list[Tensor] = []
        self.lrs: list[list[Any]] = []  # [parameter group, its rate's tensor, the rate that tensor holds]
        self.keys: list[str] = []
        self.packed: Tensor | None = None  # the metrics, stacked in the graph
        self.td: Tensor | None = None
        self.eager_left = max(self.eager_left, 1)

    @property
    def recorded(self) -> bool:
        return self.graph is not None

    def __call__(self, batch: Transitions) -> tuple[dict[str, Tensor], Tensor | None]:
        if self.failed is not None:
            return self.step(batch)
        if self.eager_left > 0:
            self.eager_left -= 1
            return self._eager_on_side_stream(batch)
        if self.graph is None:
            self._record(batch)
            if self.graph is None:  # recording failed: this batch's update, eagerly
                return self.step(batch)
        elif not all(s.shape == t.shape and s.dtype == t.dtype for s, t in zip(self.inputs, batch[:-1])):
            return self.step(batch)
        else:
            for static, t in zip(self.inputs, batch[:-1]):
                static.copy_(t, non_blocking=True)
        for held in self.lrs:  # the schedule's rate, where it moved since the last replay
            if held[0]["lr"] != held[2]:
                held[1].fill_(held[0]["lr"])
                held[2] = held[0]["lr"]
        self.graph.replay()
        values = self.packed.clone().unbind()  # the next replay overwrites the graph's outputs
        return dict(zip(self.keys, values)), None if self.td is None else self.td.clone()

    def _eager_on_side_stream(self, batch: Transitions) -> tuple[dict[str, Tensor], Tensor | None]:
        stream = torch.cuda.Stream(batch.obs.device)
        stream.wait_stream(torch.cuda.current_stream(batch.obs.device))
        with torch.cuda.stream(stream):
            out = self.step(batch)
        torch.cuda.current_stream(batch.obs.device).wait_stream(stream)
        return out

    def _record(self, batch: Transitions) -> None:
        """Record ``step`` on copies of ``batch``'s tensors (nothing runs: the caller replays)."""
        device = batch.obs.device
        self.inputs = [t.clone() for t in batch[:-1]]  # every field but the replay's indices (NumPy)
        static = Transitions(*self.inputs, batch.indices)
        groups = [g for o in self.optimizers() for g in o.param_groups]
        saved = [(g["lr"], g["capturable"]) for g in groups]
        self.lrs = [[g, torch.tensor(float(g["lr"]), device=device), g["lr"]] for g in groups]
        for group, rate, _ in self.lrs:  # Adam reads a tensor rate when the graph runs, not at recording
            group["lr"], group["capturable"] = rate, True
        graph = torch.cuda.CUDAGraph()
        try:
            graph.register_generator_state(self.generator)
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                metrics, td = self.step(static)
                packed = torch.stack([v.detach().float().reshape(()) for v in metrics.values()])
        except Exception as e:  # noqa: BLE001 - any failure to record leaves the eager update, which is correct
            self.failed = f"{type(e).__name__}: {e}".splitlines()[0]
            log.warning("--cuda-graph: the update could not be recorded as a CUDA graph (%s); it runs without one",
                        self.failed)
            self.reset()
            return
        finally:
            for group, (lr, capturable) in zip(groups, saved):
                group["lr"], group["capturable"] = lr, capturable
        self.graph, self.keys, self.packed, self.td = graph, list(metrics), packed, td
