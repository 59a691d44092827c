"""The algorithm registry: name -> config class, learner class, policy builder."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable

from shoal.errors import ShoalError


@dataclass(frozen=True)
class AlgoSpec:
    """What shoal needs to know to run an algorithm."""

    name: str
    config_cls: type
    learner_cls: type
    make_policy: Callable[..., Any]  # (config, obs_space, action_space) -> policy module
    loop: str  # driver loop on Ray: "sync" (sample -> update -> publish) or "async" (queued rollouts)
    summary: str
    runner_cls: type | None = None  # the runners' class (default: shoal.runner.EnvRunner)


ALGOS: dict[str, AlgoSpec] = {}


def register(spec: AlgoSpec) -> AlgoSpec:
    """Make an algorithm available to ``shoal.make`` and the CLI."""
    ALGOS[spec.name] = spec
    return spec


def get(name: str) -> AlgoSpec:
    """The spec of algorithm ``name``, or a clear error listing the available ones."""
    spec = ALGOS.get(name.lower())
    if spec is None:
        close = difflib.get_close_matches(name.lower(), list(ALGOS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ShoalError(f"unknown algorithm {name!r}{hint}; available: {', '.join(sorted(ALGOS))}")
    return spec


def make_config(algo: str, env: str | list[str] = "CartPole-v1", **settings: Any) -> Any:
    """The config ``shoal train ALGO --env ENV --set key=value ...`` runs: the algorithm's defaults,
    its shipped preset for ``env`` (tuned, as rl-baselines3-zoo's), then ``settings``.
    A config class called directly (``shoal.SACConfig(env=...)``) has the defaults only."""
    from shoal.config import build

    spec = get(algo)
    return build(spec.config_cls, spec.name, env=env, sets=settings, sets_source="make_config")


def spec_for(config: Any) -> AlgoSpec:
    """The spec of the algorithm a config belongs to."""
    return get(config.algo)


from shoal.algos import a2c, appo, ars, crossq, ddpg, dqn, impala, ppo, qrdqn, sac, td3, tqc, trpo  # noqa: E402,F401  (each registers itself)
