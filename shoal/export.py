"""A trained policy as an ONNX model: its most likely actions, for runtimes with neither Python nor
PyTorch (ONNX Runtime from C++, C#, Java, JavaScript; a game engine; a robot's controller).

The model takes what :meth:`shoal.policy.Policy.act` takes in its flat form, the vector the
policy server takes too: ``obs`` [N, *observation shape] (float32 vectors, one-hot for discrete
observations, the action mask last where the env gives one; uint8 frames as the env gives them),
and gives ``action`` [N, ...] as the env takes it (indices from the space's ``start``, continuous
actions within the bounds). A recurrent policy (``lstm_size``) takes and gives its memory too:
``lstm_h`` and ``lstm_c`` [N, 2 * lstm_size] in, zeros when episodes start, and
``next_lstm_h`` and ``next_lstm_c`` out, for the next step. The observation normaliser
(``normalize_obs``) is part of the model.

The model's ``metadata_props`` say what it was made from: ``shoal.algo``, ``shoal.version``
(the policy version), and the spaces (``shoal.observation_space``, ``shoal.action_space``, as
checkpoints describe them, in JSON).

Exporting needs the ``export`` extra (``pip install 'shoal[export]'``: onnx and onnxscript, which
PyTorch's exporter uses, and ONNX Runtime, which checks the model): the file is written only
once ONNX Runtime gives the policy's own actions on sample observations.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from shoal.envs import describe_space
from shoal.errors import ShoalError

if TYPE_CHECKING:
    from shoal.policy import Policy, PolicyModule

CHECKED_OBSERVATIONS = 256
"""Sample observations an export is checked on (:func:`export_onnx`)."""

CHECKED_STEPS = 4
"""Steps a recurrent policy's export is checked on, its memory carried from one to the next."""


class DeployedPolicy(nn.Module):
    """What is exported: raw observations -> normaliser -> the most likely actions -> the env's
    form of them; for a recurrent policy, with its memory in and out."""

    def __init__(self, module: PolicyModule):
        super().__init__()
        self.module = module

    def forward(self, obs: Tensor, lstm_h: Tensor | None = None,
                lstm_c: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor, Tensor]:
        m = self.module
        x = m.mixed_floats(obs.float()) if m.mixed else m.normalize(obs)  # a MixedEncoder reads floats too
        if lstm_h is None or lstm_c is None:
            return m.env_actions(m.act(x, True))
        actions, h, c = m.act_with_memory(x, (lstm_h, lstm_c))
        return m.env_actions(actions), h, c


def _needs(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise ShoalError(f"exporting to ONNX needs {name}: pip install 'shoal[export]' (onnx, onnxscript, "
                         "onnxruntime)") from None


@contextlib.contextmanager
def _quiet():
    """PyTorch's exporter logs its progress and warns of optional packages (torchvision's ops):
    not the user's concern."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(open(os.devnull, "w")) as sink:
            warnings.simplefilter("ignore")
            try:
                yield
            finally:
                sink.close()
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def sample_observations(policy: Policy, n: int, seed: int = 0) -> np.ndarray:
    """``n`` observations drawn from the policy's observation space, as the model takes them."""
    space = policy.observation_space
    space.seed(seed)
    return np.stack([space.sample() for _ in range(n)]).astype(policy.module.raw_dtype)


def export_onnx(policy: Policy, path: str | Path) -> dict[str, Any]:
    """Write ``policy`` as an ONNX model at ``path`` (atomically), once ONNX Runtime has given the
    policy's own actions for sample observations. Returns the path, what the model takes and gives
    (``inputs`` and ``outputs``: name -> (shape after the batch, dtype)) and how many sample
    observations it was checked on."""
    ort = [_needs(name) for name in ("onnx", "onnxscript", "onnxruntime")][-1]
    if policy.device.type != "cpu":  # traced and checked on the CPU, where ONNX Runtime runs it here
        from shoal.policy import Policy

        policy = Policy(copy.deepcopy(policy.module).cpu(), policy.version, policy.config,
                        policy.saved_env_observation_space)
    module, path = policy.module, Path(path)
    if path.is_dir():
        raise ShoalError(f"{path} is a directory: name the .onnx file to write")
    if not path.parent.is_dir():
        raise ShoalError(f"cannot write {path}: {path.parent} is not a directory")
    deployed = DeployedPolicy(module).eval()
    batch = torch.export.Dim("batch")
    obs = torch.as_tensor(sample_observations(policy, 3))
    inputs: dict[str, Tensor] = {"obs": obs}
    if module.recurrent:
        # two tensors: one given twice would be traced as one input
        inputs.update(lstm_h=torch.zeros(3, 2 * module.lstm_size), lstm_c=torch.zeros(3, 2 * module.lstm_size))
    outputs = ["action", "next_lstm_h", "next_lstm_c"] if module.recurrent else ["action"]
    try:
        with _quiet(), torch.no_grad():
            program = torch.onnx.export(deployed, tuple(inputs.values()), dynamo=True, verbose=False,
                                        input_names=list(inputs), output_names=outputs,
                                        dynamic_shapes=tuple({0: batch} for _ in inputs))
    except Exception as e:  # the exporter's errors run to pages: their first line, with the policy named
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ShoalError(f"PyTorch could not export {type(module).__name__} to ONNX: {first}") from e
    program.model.metadata_props.update({
        "shoal.algo": str(getattr(policy.config, "algo", "")), "shoal.version": str(policy.version),
        "shoal.observation_space": json.dumps(describe_space(policy.observation_space)),
        "shoal.action_space": json.dumps(describe_space(policy.action_space))})
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with _quiet():
            program.save(str(tmp))
        _check(policy, ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"]))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    with torch.no_grad():
        given = deployed(*inputs.values())
    spec = lambda t: (list(t.shape[1:]), str(t.dtype).removeprefix("torch."))  # noqa: E731
    return {"path": path, "inputs": {k: spec(v) for k, v in inputs.items()},
            "outputs": dict(zip(outputs, map(spec, given if isinstance(given, tuple) else (given,)))),
            "checked": CHECKED_OBSERVATIONS}


def _check(policy: Policy, session: Any) -> None:
    """Refuse a model whose actions ONNX Runtime computes otherwise than the policy does: on
    sample observations, a recurrent policy over several steps of its memory (held here, so a
    deployed policy's own memory, mid-episode, is left as it was)."""
    module = policy.module
    steps = CHECKED_STEPS if module.recurrent else 1
    obs = sample_observations(policy, CHECKED_OBSERVATIONS * steps).reshape(steps, CHECKED_OBSERVATIONS,
                                                                              *policy.observation_space.shape)
    # each side carries its own memory from step to step, from zeros
    ours = theirs = None
    if module.recurrent:
        ours = theirs = (np.zeros((CHECKED_OBSERVATIONS, 2 * module.lstm_size), np.float32),) * 2
    for step in obs:
        if ours is None:
            want, (got,) = policy.act(step, deterministic=True), session.run(None, {"obs": step})
        else:
            want, ours = policy.act_with_memory(step, ours)
            got, *theirs = session.run(None, {"obs": step, "lstm_h": theirs[0], "lstm_c": theirs[1]})
        if got.shape != want.shape or got.dtype != want.dtype:
            raise ShoalError(f"the exported model gives actions of shape {got.shape} and dtype {got.dtype}; the "
                             f"policy {want.shape} and {want.dtype}")
        same = (got == want) if np.issubdtype(want.dtype, np.integer) else np.isclose(got, want, rtol=1e-4, atol=1e-5)
        wrong = int((~same.reshape(len(step), -1).all(-1)).sum())
        if wrong:
            raise ShoalError(f"the exported model's actions differ from the policy's for {wrong} of "
                             f"{len(step)} sample observations: not written")
