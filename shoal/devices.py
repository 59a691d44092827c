"""Where learners (and central inference servers) compute, ``--device``, and where runners act,
``--runner-device``.

Runners act on the CPU unless --runner-device says otherwise, and evaluators always do; a
learner's networks, optimiser and noise live on its device, and everything it hands back is on
the CPU (a runner's rollouts too, wherever it acts). Tests swap :func:`generator` for a stand-in
device's (tests/fake_device.py), so roles call it through this module.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from shoal.errors import ShoalError


def named(spec: str) -> bool:
    """Whether ``spec`` names a device shoal trains on: auto, cpu, cuda or cuda:N (or a device
    registered as torch's PrivateUse1 backend, as the tests' stand-in). Others torch knows (mps,
    xpu) are refused: the running statistics are float64, which MPS lacks, and neither is tested."""
    if spec == "auto":
        return True
    try:
        kind = torch.device(spec).type
    except RuntimeError:
        return False
    return kind in ("cpu", "cuda", torch._C._get_privateuse1_backend_name())


def resolve(spec: str, flag: str = "--device") -> torch.device:
    """The device ``flag`` names, checked here, where the role using it runs (on Ray, a machine the
    driver may not be): auto is cuda where torch sees one, else the CPU."""
    if not named(spec):
        raise ShoalError(f"{flag} must be cpu, cuda, cuda:N or auto, got {spec!r}")
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cpu":
        return device
    backend = getattr(torch, device.type, None)
    count = backend.device_count() if backend is not None and backend.is_available() else 0
    if count == 0:
        build = f"torch {torch.__version__}" + (" has no CUDA support" if device.type == "cuda" and
                                                not torch.backends.cuda.is_built() else " sees none here")
        raise ShoalError(f"{flag} {spec}: no {device.type} device ({build}); train with {flag} cpu, or "
                         "auto to use one where there is one")
    if (device.index or 0) >= count:
        raise ShoalError(f"{flag} {spec}: there are {count} {device.type} devices here, numbered from 0")
    return torch.device(device.type, device.index or 0)


def generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator of ``device``, seeded (random draws on a device take that device's generator)."""
    return torch.Generator(device).manual_seed(seed)


def upload(x: Any, device: torch.device) -> torch.Tensor:
    """``x`` (an array or a CPU tensor) as a tensor on ``device``; on the CPU, sharing its memory,
    but for a read-only array's (one Ray's object store hands out, such as the runners'
    observation statistics a learner merges), which is copied: torch warns that a tensor must not
    share it, and a write through one would not be refused. A copy to a GPU is queued without
    waiting for the work queued before it, as a blocking one would (CUDA stages pageable memory
    before the call returns, so ``x`` may go at once)."""
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        x = x.copy()
    return torch.as_tensor(x).to(device, non_blocking=True)


def to_cpu(tree: Any) -> Any:
    """``tree`` (dicts, lists, tuples) with its tensors copied to the CPU: a learner's state leaves
    it this way, so that a driver or checkpoint reader without the learner's GPU can read it."""
    if isinstance(tree, torch.Tensor):
        return tree.cpu()
    if isinstance(tree, dict):
        return {k: to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        items = [to_cpu(v) for v in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)  # (a NamedTuple's fields)
    return tree
