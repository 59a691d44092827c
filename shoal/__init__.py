"""shoal: distributed deep reinforcement learning, the same code from one process to a Ray cluster.

    import shoal
    config = shoal.PPOConfig(env="CartPole-v1", total_steps=50_000)
    with shoal.make(config) as algo:
        for _ in range(100):
            metrics = algo.train()
        print(algo.evaluate())
        algo.save("my_checkpoint")
    policy = shoal.load_policy("my_checkpoint")
    action = policy.act(obs)
    config = shoal.make_config("sac", "Pendulum-v1", seed=1)  # the tuned preset, as `shoal train` uses

Names are imported on first use, so a process that needs only a light piece (a Ray actor
holding the WeightStore, ``shoal --help``) does not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Algorithm": "shoal.algorithm", "make": "shoal.algorithm", "load": "shoal.algorithm",
    "load_policy": "shoal.algorithm", "ALGOS": "shoal.algos", "PPOConfig": "shoal.algos.ppo",
    "Config": "shoal.config", "ConfigError": "shoal.errors", "ShoalError": "shoal.errors",
    "Policy": "shoal.policy", "train": "shoal.trainer", "resume": "shoal.trainer",
    "A2CConfig": "shoal.algos.a2c", "TRPOConfig": "shoal.algos.trpo", "IMPALAConfig": "shoal.algos.impala",
    "APPOConfig": "shoal.algos.appo", "DQNConfig": "shoal.algos.dqn", "DDPGConfig": "shoal.algos.ddpg",
    "TD3Config": "shoal.algos.td3", "SACConfig": "shoal.algos.sac", "CrossQConfig": "shoal.algos.crossq",
    "TQCConfig": "shoal.algos.tqc", "QRDQNConfig": "shoal.algos.qrdqn",
    "ARSConfig": "shoal.algos.ars", "batched": "shoal.batching",
    "RemoteVectorEnv": "shoal.remote.client", "PolicyClient": "shoal.remote.policyserver",
    "EnvServer": "shoal.remote.envserver", "PolicyServer": "shoal.remote.policyserver",
    "ServerError": "shoal.remote.client",
    "make_config": "shoal.algos", "tune": "shoal.tuning", "train_seeds": "shoal.seeds",
    "resume_seeds": "shoal.seeds",
}
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'shoal' has no attribute {name!r}")
