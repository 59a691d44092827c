"""Return estimators shared by the on-policy algorithms."""

from __future__ import annotations

import torch
from torch import Tensor


def next_values(values: Tensor, last_value: Tensor, final_value: Tensor, final_idx: Tensor,
                terminated: Tensor, truncated: Tensor) -> Tensor:
    """V(s_{t+1}) for every step [T, B], with same-step autoreset.

    values [T, B] are V(s_t); last_value [B] is V of the observation after the last step;
    final_value [K] is V of the true last observation of the episodes ending at final_idx [K, 2].
    A terminated step has no future (0); a truncated one bootstraps from its final observation,
    not from the next episode's first (the time-limit bug that CleanRL carries; SB3 #633).
    """
    nxt = torch.cat([values[1:], last_value[None]], dim=0)
    if len(final_idx):
        nxt = nxt.index_put((final_idx[:, 0], final_idx[:, 1]), final_value)
    return torch.where(terminated, torch.zeros_like(nxt), nxt)


def gae(rewards: Tensor, values: Tensor, next_value: Tensor, done: Tensor, gamma: float,
        lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16): advantages and returns [T, B].

    ``next_value`` [T, B] already encodes termination (0) and truncation (bootstrap); ``done``
    [T, B] (terminated or truncated) stops the recursion at episode ends.
    """
    delta = rewards + gamma * next_value - values  # [T, B]
    adv = torch.zeros_like(values)
    running = torch.zeros_like(values[0])
    not_done = (~done).to(values.dtype)
    for t in range(len(rewards) - 1, -1, -1):
        running = delta[t] + gamma * lam * not_done[t] * running
        adv[t] = running
    return adv, adv + values
