"""Fault injection for tests and soak runs (as RLlib's FaultInjectEnv): envs that fail on cue.

``--env shoal.testing:FaultyCartPole-v1`` is CartPole-v1 whose instances raise RuntimeError at
chosen steps. The plan comes from the SHOAL_FAULTS environment variable, JSON mapping an env's
first reset seed to the step counts (since that env was made) at which it raises, e.g.
``{"1000": [50, 120]}``: runner r's env b is first reset with seed + 1000 * (r + 1) + b, so a
plan names exact envs of exact runners and every run fails the same way. Besides step numbers
(raise there), a plan may hold ``"exit@N"`` (the process dies at step N: a crashed runner) and
``"hang@N:S"`` (step N sleeps S seconds: a runner that stops answering).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import gymnasium as gym


class FaultInjectEnv(gym.Wrapper):
    """Raises RuntimeError at the planned steps of the env whose first reset used a planned seed."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.plan = {int(k): v for k, v in json.loads(os.environ.get("SHOAL_FAULTS", "{}")).items()}
        self.failing: set[int] = set()
        self.exits: set[int] = set()
        self.hangs: dict[int, float] = {}
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        if seed is not None and self.steps == 0:
            for item in self.plan.get(seed, []):
                if isinstance(item, int):
                    self.failing.add(item)
                elif item.startswith("exit@"):
                    self.exits.add(int(item[5:]))
                elif item.startswith("hang@"):
                    step, seconds = item[5:].split(":")
                    self.hangs[int(step)] = float(seconds)
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.steps += 1
        if self.steps in self.failing:
            raise RuntimeError(f"injected fault at step {self.steps}")
        if self.steps in self.exits:
            os._exit(3)  # the whole process dies, as a crashed runner would
        if self.steps in self.hangs:
            time.sleep(self.hangs[self.steps])
        return self.env.step(action)


def _faulty_cartpole(**kwargs: Any) -> gym.Env:
    return FaultInjectEnv(gym.make("CartPole-v1", **kwargs))


if "FaultyCartPole-v1" not in gym.registry:
    gym.register("FaultyCartPole-v1", entry_point=_faulty_cartpole)
