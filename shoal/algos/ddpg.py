"""Deep Deterministic Policy Gradient (Lillicrap et al. 2016), as in Fujimoto et al.'s "OurDDPG":
one critic, actor updated every step, no target smoothing. The learner is TD3's with those off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shoal.algos import AlgoSpec, register
from shoal.algos.td3 import TD3Config, TD3Learner, make_policy


@dataclass(frozen=True)
class DDPGConfig(TD3Config):
    """DDPG for continuous actions."""

    algo: ClassVar[str] = "ddpg"

    twin_critics: bool = False
    """One critic (DDPG); True would be TD3's clipped double Q."""
    policy_delay: int = 1
    """Update the actor with every critic update."""
    target_noise: float = 0.0
    """No target policy smoothing."""


register(AlgoSpec("ddpg", DDPGConfig, TD3Learner, make_policy, "sync",
                  "Deep Deterministic Policy Gradient (continuous actions)"))
