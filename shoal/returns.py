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


def vtrace(behaviour_logp: Tensor, target_logp: Tensor, rewards: Tensor, values: Tensor, next_value: Tensor,
           done: Tensor, gamma: float, lam: float = 1.0, rho_bar: float = 1.0, c_bar: float = 1.0,
           pg_rho_bar: float | None = None) -> tuple[Tensor, Tensor]:
    """V-trace (Espeholt et al. 2018, eq. 1 and Sec. 4.2): value targets v_s and policy-gradient
    advantages [T, B] for trajectories of a behaviour policy mu, corrected towards pi.

    ``behaviour_logp``/``target_logp`` [T, B] are log mu(a_t|x_t) and log pi(a_t|x_t);
    ``next_value`` [T, B] is V(x_{t+1}) with termination (0) and truncation (the true final
    observation's value) already applied, as for :func:`gae`; ``done`` cuts the traces at episode
    ends. Truncation ratios rho_t = min(rho_bar, pi/mu) and c_t = lam * min(c_bar, pi/mu); the
    advantage uses min(pg_rho_bar, pi/mu) (default rho_bar). With pi = mu, lam = 1 and bars >= 1
    it reduces to the n-step returns bootstrapped from the rollout's end.
    """
    with torch.no_grad():
        ratio = (target_logp - behaviour_logp).exp()
        rho = ratio.clamp(max=rho_bar)
        c = lam * ratio.clamp(max=c_bar)
        delta = rho * (rewards + gamma * next_value - values)
        carry = gamma * c * (~done).to(values.dtype)
        vs_minus_v = torch.zeros_like(values)
        acc = torch.zeros_like(values[0])
        for t in range(len(rewards) - 1, -1, -1):
            acc = delta[t] + carry[t] * acc
            vs_minus_v[t] = acc
        vs = values + vs_minus_v
        # v_{s+1} inside the advantage: the next target within the episode, else the bootstrap.
        vs_next = torch.where(done, next_value, torch.cat([vs[1:], next_value[-1:]], dim=0))
        pg_rho = ratio.clamp(max=rho_bar if pg_rho_bar is None else pg_rho_bar)
        return vs, pg_rho * (rewards + gamma * vs_next - values)
