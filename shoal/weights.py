"""WeightStore: the newest weights per policy id, with a version (publish/subscribe).

What is synchronised (this class) is kept apart from how it travels: in-process the store holds
the weights themselves; on Ray, :class:`shoal.backends.RayWeightStore` wraps an actor of this
class that holds object-store references, so each publish is one ``ray.put`` and runners
fetch zero-copy.
"""

from __future__ import annotations

from typing import Any


class WeightStore:
    """Keeps the latest (version, payload) per policy id; older publishes are ignored."""

    def __init__(self) -> None:
        self._latest: dict[str, tuple[int, Any]] = {}

    def publish(self, policy_id: str, version: int, weights: Any) -> int:
        """Publish ``weights`` as ``version`` of ``policy_id``; returns the newest version held."""
        current = self._latest.get(policy_id)
        if current is None or version > current[0]:
            self._latest[policy_id] = (version, weights)
        return self._latest[policy_id][0]

    def latest(self, policy_id: str, newer_than: int = -1) -> tuple[int, Any] | None:
        """The newest (version, weights) of ``policy_id`` if newer than ``newer_than``, else None."""
        current = self._latest.get(policy_id)
        return current if current is not None and current[0] > newer_than else None

    def version(self, policy_id: str) -> int:
        """Newest version of ``policy_id`` held (-1 if none)."""
        current = self._latest.get(policy_id)
        return -1 if current is None else current[0]
