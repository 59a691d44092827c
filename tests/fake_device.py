"""A stand-in accelerator for tests on machines without one: the ``fakegpu`` device.

CI has no GPU, yet a learner on ``--device cuda`` must keep every tensor it computes with on
that device, move what it reads from NumPy there, and hand back CPU tensors and arrays. The
mistakes that break this (a tensor made on the CPU and met on the GPU, ``.numpy()`` of a GPU
tensor, noise drawn from a CPU generator for a GPU tensor, a checkpoint of GPU tensors) show only
on a GPU. This module registers a device that makes the same mistakes fail on a CPU:

- tensors on ``fakegpu:0`` hold a CPU tensor and compute with it, through torch's PrivateUse1
  backend hooks (``torch.utils.backend_registration``) and a ``__torch_dispatch__`` subclass;
- an op that meets a ``fakegpu`` tensor and a CPU tensor fails, as CUDA's do. CUDA lets some
  through, and so does this device: 0-dim CPU tensors in elementwise ops (numbers to CUDA),
  copies, and indexing with CPU indices;
- ``.numpy()`` fails, and so does pickling (``torch.save``): state leaves the device as CPU
  tensors, as a driver without a GPU needs it;
- random draws check their generator: :func:`generator` gives one for the device, and a draw
  for a ``fakegpu`` tensor with another generator, or for a CPU one with this one, fails;
- ``host_reads`` counts the values the host reads from the device (``.item()``, ``float()``,
  ``.cpu()`` ...), and ``blocking_uploads`` the copies to it that do not pass ``non_blocking``
  (``torch.as_tensor(array, device=)``, ``.to(device)``): on a GPU each makes the CPU wait for
  the queued work (seen so with CUDA's sync debug mode on an H200, tests/test_cuda.py).

Values are the CPU's, bit for bit, and so are the random streams (the device's generator is a
CPU generator seeded the same), so a run on ``fakegpu`` must equal the same run on the CPU.
Call :func:`install` once per process, before its first backward pass (the autograd engine
sizes its device queues then; tests/conftest.py does it), and run the code under test inside
:func:`checks`. It cannot be undone: torch allows one PrivateUse1 backend per process.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

NAME = "fakegpu"
DEVICE = f"{NAME}:0"  # a string: torch knows the name once install() has run
# Ops CUDA lets a CPU tensor take part in: copies between devices, and indexing with CPU indices.
CROSS_DEVICE = {"aten::_to_copy", "aten::copy_", "aten::index", "aten::index_put_", "aten::index_put",
                "aten::_index_put_impl_"}
# Ops that take no 0-dim CPU tensor among device ones (elementwise ones read it as a number)
NO_CPU_SCALARS = {"aten::cat", "aten::stack"}
host_reads = 0  # values the host has read from the device: each would make it wait for the GPU
blocking_uploads = 0  # copies to the device without non_blocking: each would make it wait too
_generators: list[torch.Generator] = []  # the device's (held: a freed one's id could be another's)


def _on_device(t: Any) -> bool:
    return isinstance(t, FakeTensor)


class FakeTensor(torch.Tensor):
    """A tensor on ``fakegpu:0`` whose data is the CPU tensor ``inner``."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> FakeTensor:
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(),
                                                   storage_offset=inner.storage_offset(), dtype=inner.dtype,
                                                   device=DEVICE, requires_grad=False)

    def __init__(self, inner: torch.Tensor):
        self.inner = inner

    def __repr__(self) -> str:
        return f"FakeTensor({self.inner!r}, device={DEVICE!r})"

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"can't convert {DEVICE} device type tensor to numpy. Use Tensor.cpu() to copy the "
                        "tensor to host memory first.")

    def tolist(self) -> Any:  # torch refuses subclasses; CUDA tensors copy to the host
        global host_reads
        host_reads += 1
        return self.inner.tolist()

    def __reduce_ex__(self, protocol: int) -> Any:
        raise RuntimeError(f"a {DEVICE} tensor was pickled: state that leaves a learner must be on the CPU")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        name = func._schema.name
        scalars_pass = name not in NO_CPU_SCALARS
        if name not in CROSS_DEVICE and any(isinstance(t, torch.Tensor) and not _on_device(t) and
                                            (t.dim() > 0 or not scalars_pass) for t in flat):
            raise RuntimeError(f"{name}: Expected all tensors to be on the same device, but found at least two "
                               f"devices, {DEVICE} and cpu!")
        leaving = kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cpu"
        leaving |= name == "aten::copy_" and not _on_device(args[0])  # host_tensor.copy_(device_tensor)
        if leaving or name == "aten::_local_scalar_dense":  # .cpu(), .numpy() of it, .item(), float(), bool()
            global host_reads
            host_reads += 1
        unwrap = lambda t: t.inner if _on_device(t) else t  # noqa: E731
        func = _CUDA_ONLY.get(func, func)
        out = func(*tree_map(unwrap, args), **{k: _cpu(unwrap(v)) for k, v in kwargs.items()})
        if leaving:
            return out
        mine = {id(t.inner): t for t in flat if _on_device(t)}  # an in-place op returns its own argument

        def wrap(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and not _on_device(x):
                return mine[id(x)] if id(x) in mine else FakeTensor(x)
            return x

        return tree_map(wrap, out)


def _fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """CUDA's fused LSTM cell (torch picks it for any device but the CPU), on CPU tensors: the
    new (h, c), and the activated gates [i, f, g, o] its backward reads."""
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    return o * cy.tanh(), cy, torch.cat([i, f, g, o], 1)


def _fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """The gradients of :func:`_fused_lstm_cell`'s gates, cx and biases."""
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_c = torch.zeros_like(cy) if grad_cy is None else grad_cy.clone()
    grad_o = torch.zeros_like(cy)
    if grad_hy is not None:
        grad_o = grad_hy * tanh_cy
        grad_c = grad_c + grad_hy * o * (1 - tanh_cy.pow(2))
    grad_gates = torch.cat([grad_c * g * i * (1 - i), grad_c * cx * f * (1 - f), grad_c * i * (1 - g.pow(2)),
                            grad_o * o * (1 - o)], 1)
    return grad_gates, grad_c * f, grad_gates.sum(0) if has_bias else None


_CUDA_ONLY = {torch.ops.aten._thnn_fused_lstm_cell.default: _fused_lstm_cell,
              torch.ops.aten._thnn_fused_lstm_cell_backward_impl.default: _fused_lstm_cell_backward}


def _cpu(x: Any) -> Any:
    """The device argument an op on the inner CPU tensors takes."""
    return torch.device("cpu") if isinstance(x, torch.device) and x.type == NAME else x


def _factory(op, *args, **kwargs):
    """Ops that make tensors on the device from none on it (zeros, empty, randn ... device=)."""
    out = op(*args, **{k: _cpu(v) for k, v in kwargs.items()})
    return tree_map(lambda x: FakeTensor(x) if isinstance(x, torch.Tensor) else x, out)


class _Checks(TorchFunctionMode):
    """A draw's generator must belong to the device it draws on, as CUDA's must; and tensors made
    on the device from Python values are made as CUDA's are (see below)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is torch._C.TensorBase.data and func.__name__ == "__set__" and \
                _on_device(args[0]):  # (torch's vector_to_parameters)
            func(*args)
            args[0].inner = args[1].inner
            return None
        _count_blocking_upload(func, args, kwargs)
        g = kwargs.get("generator")
        if g is not None:
            device = kwargs.get("device")
            if device is None:
                tensors = [t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)]
                device = tensors[0].device if tensors else torch.device("cpu")
            on_device = torch.device(device).type == NAME
            mine = any(g is x for x in _generators)
            if on_device != mine:
                raise RuntimeError(f"Expected a '{'fakegpu' if on_device else 'cpu'}' device type for generator but "
                                   f"found '{'fakegpu' if mine else 'cpu'}'")
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == NAME and not _on_device(args[0] if args else None):
            # Tensors made on the device from none on it (torch.tensor, arange, zeros, randn ...) are
            # made on the CPU and copied: torch's own paths to a PrivateUse1 device fail for some of
            # them in Python backends (numbers to tensor, arange's resize of its output). The
            # generator was checked above.
            grad = kwargs.get("requires_grad", False)
            made = {**kwargs, "device": "cpu"}
            made.pop("requires_grad", None)
            out = func(*args, **made)
            return out.to(device).requires_grad_(grad) if isinstance(out, torch.Tensor) else out
        return func(*args, **kwargs)


def _count_blocking_upload(func, args, kwargs) -> None:
    """Count a copy of host data to the device that waits for the device's queue, as CUDA's
    blocking copies do: ``torch.as_tensor``/``torch.tensor`` with ``device=``, or ``Tensor.to``
    (device given by position or name) without ``non_blocking=True``."""
    source = args[0] if args else kwargs.get("data")
    if _on_device(source):
        return
    if func in (torch.as_tensor, torch.tensor):
        device, non_blocking = kwargs.get("device"), False
    elif func is torch.Tensor.to:
        rest = [*args[1:], kwargs.get("device")]
        device = next((d for d in rest if isinstance(d, (str, torch.device))), None)
        non_blocking = kwargs.get("non_blocking", any(x is True for x in args[1:]))
    else:
        return
    if device is not None and torch.device(device).type == NAME and not non_blocking:
        global blocking_uploads
        blocking_uploads += 1


def waits() -> int:
    """How many times so far the host would have waited for the device: values read back and
    blocking copies to it."""
    return host_reads + blocking_uploads


def generator(device: torch.device | str, seed: int) -> torch.Generator:
    """What ``shoal.devices.generator`` gives: a generator of the device (fakegpu too)."""
    if torch.device(device).type != NAME:
        return torch.Generator(device).manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    _generators.append(g)
    return g


@contextlib.contextmanager
def checks() -> Iterator[None]:
    """Run the code under test with the device's checks, in this thread and in the threads it
    starts (torch's modes are per thread; the inference servers' batchers run in their own)."""
    run = threading.Thread.run

    def checked_run(thread: threading.Thread) -> None:
        with _Checks():
            run(thread)

    threading.Thread.run = checked_run  # type: ignore[method-assign]
    try:
        with _Checks():
            yield
    finally:
        threading.Thread.run = run  # type: ignore[method-assign]


@functools.cache
def install() -> None:
    """Register the device (once per process)."""
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(NAME)
    library = torch.library.Library("_", "IMPL")
    library.fallback(_factory, "PrivateUse1")
    install.library = library  # type: ignore[attr-defined]  # kept alive: dropping it unregisters
