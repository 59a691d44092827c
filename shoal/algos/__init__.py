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


# Algorithms as RLlib, stable-baselines3 (sb3-contrib, rl-zoo) and CleanRL name them that shoal runs
# as one of its own with options, or does not have: a user who types the name they know is told
# what to type instead. Keys are compared in lower case without "_" and "-".
_MULTI_AGENT = "is a multi-agent algorithm: shoal trains single-agent envs only for now"
_OFFLINE = "learns from a dataset (offline RL): shoal learns from envs only"
PEER_ALGOS: dict[str, str] = {
    "apex": "Ape-X is `shoal train dqn --apex --backend ray --num-env-runners 4` (qrdqn, ddpg, td3, sac, tqc and "
            "crossq take --apex too)",
    "apexdqn": "RLlib's APEX_DQN is `shoal train dqn --apex --backend ray --num-env-runners 4`",
    "apexddpg": "RLlib's APEX_DDPG is `shoal train ddpg --apex --backend ray --num-env-runners 4`",
    "rainbow": "Rainbow is `shoal train dqn --num-atoms 51 --noisy --dueling --n-step 3 --prioritized` (double by "
               "default; examples/rainbow/atari.yaml has the paper's Atari settings)",
    "c51": "C51 is `shoal train dqn --num-atoms 51`",
    "ddqn": "double DQN is `shoal train dqn` (double by default)",
    "doubledqn": "double DQN is `shoal train dqn` (double by default)",
    "duelingdqn": "dueling DQN is `shoal train dqn --dueling`",
    "noisydqn": "noisy DQN is `shoal train dqn --noisy`",
    "her": "HER is a replay option here: `shoal train sac --her-goals 4` (dqn, td3 and ddpg take --her-goals too)",
    "ppo2": "PPO2 is `shoal train ppo`",
    "a3c": "A3C's actor-critic is `shoal train a2c` (synchronous) or `shoal train impala` (asynchronous, with "
           "V-trace)",
    "sacd": "discrete SAC is `shoal train sac` on an env with discrete actions",
    "sacdiscrete": "discrete SAC is `shoal train sac` on an env with discrete actions",
    "discretesac": "discrete SAC is `shoal train sac` on an env with discrete actions",
    "recurrentppo": "sb3-contrib's RecurrentPPO is `shoal train ppo --lstm-size 64` (a2c, impala and appo take "
                    "--lstm-size too)",
    "ppolstm": "rl-zoo's ppo_lstm is `shoal train ppo --lstm-size 64`",
    "maskableppo": "sb3-contrib's MaskablePPO is `shoal train ppo`: it reads an env's action masks itself (an "
                   "action_mask entry of a Dict observation, or an action_masks() method)",
    "ppomask": "rl-zoo's ppo_mask is `shoal train ppo`: it reads an env's action masks itself (an action_mask entry "
               "of a Dict observation, or an action_masks() method)",
    **{name: f"{name.upper()} {_MULTI_AGENT}" for name in ("mappo", "ippo", "maddpg", "qmix", "vdn")},
    **{name: f"{label} {_OFFLINE}" for name, label in (("bc", "BC"), ("marwil", "MARWIL"), ("cql", "CQL"),
                                                       ("iql", "IQL"), ("bcq", "BCQ"), ("td3bc", "TD3+BC"))},
}


def get(name: str) -> AlgoSpec:
    """The spec of algorithm ``name``, or a clear error: what shoal calls a peer's name for it, or the
    available ones."""
    spec = ALGOS.get(name.lower())
    if spec is None:
        peer = PEER_ALGOS.get(name.lower().replace("_", "").replace("-", ""))
        close = difflib.get_close_matches(name.lower(), list(ALGOS), n=1)
        hint = f": {peer}" if peer else f" (did you mean {close[0]}?)" if close else ""
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
