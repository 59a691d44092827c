"""Trust Region Policy Optimization (Schulman et al. 2015), discrete, continuous and multi-discrete actions.

The policy step is the natural gradient: conjugate gradient solves F x = g with Fisher-vector
products (the Hessian of the mean KL, by double backprop), the step is scaled to the KL bound
(``max_kl``), and a backtracking line search keeps only a step that improves the surrogate and
satisfies the bound. The value function is fitted separately, by minibatch Adam regression.

With images (or ``--encoder``) the actor and the critic share one encoder, which the
natural-gradient step trains with the actor's weights; the value regression fits the critic's
head on its features and leaves it alone, so the policy moves by the bounded step only.
(sb3-contrib's TRPO ``CnnPolicy`` lets the value loss move the shared encoder too: on
MiniGrid-Empty-5x5-v0 that moved the policy by a KL of 1.04 in the first iteration, 20 times
the step's bound of 0.05, and by up to 0.03 later.) With ``--no-share-encoder`` the critic has
an encoder of its own, which the value regression trains with the critic's head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterable

import torch
from torch import Tensor
from torch.distributions import Distribution, kl_divergence

from shoal.algos import AlgoSpec, register
from shoal.config import _check
from shoal.learner import clip_grad_norm, read_metrics
from shoal.onpolicy import OnPolicyConfig, OnPolicyLearner, explained_variance, feed_forward_only, make_actor_critic
from shoal.runner import Rollout


@dataclass(frozen=True)
class TRPOConfig(OnPolicyConfig):
    """TRPO: KL-constrained natural-gradient policy steps; the value function is fitted apart
    (``lr`` is the value function's; ``vf_coef`` does not apply)."""

    algo: ClassVar[str] = "trpo"

    rollout_steps: int = 256
    """Steps each env takes per iteration (n_steps)."""
    lr: float = 1e-3
    """Adam learning rate of the value function."""
    max_kl: float = 0.01
    """Bound on the KL divergence between the policies before and after a step: its mean over
    states, summed over action dimensions (the paper's, as OpenAI baselines' and Spinning Up's).
    sb3-contrib's ``target_kl`` bounds the mean over a Gaussian's dimensions instead of the sum,
    so it is this ``max_kl`` divided by the number of continuous action dimensions (the presets
    from rl-zoo convert)."""
    cg_iters: int = 15
    """Conjugate-gradient iterations."""
    cg_damping: float = 0.1
    """Damping added to the Fisher matrix (F + damping I), for a stable solve."""
    line_search_shrink: float = 0.8
    """Backtracking factor of the line search."""
    line_search_steps: int = 10
    """Step sizes the line search tries before keeping the old policy."""
    fisher_subsample: int = 1
    """Every k-th state of the batch goes into the Fisher-vector products, a conjugate-gradient
    step's cost (Schulman's thesis, pp. 40-42; OpenAI baselines' TRPO takes every 5th): the
    gradient, the step's scale and the line search keep the whole batch. Worth it for images,
    where each product is a second backward pass through the encoder."""
    vf_epochs: int = 10
    """Passes of value-function regression over each batch."""
    vf_minibatch_size: int = 128
    """Samples per value-function step."""

    def __post_init__(self) -> None:
        super().__post_init__()
        feed_forward_only(self)
        _check(self.vf_coef == OnPolicyConfig.vf_coef, f"vf_coef {self.vf_coef}: trpo fits its value function apart "
               "(vf_epochs, vf_minibatch_size, lr), with no joint loss for vf_coef to weigh")
        _check(self.max_kl > 0, "max_kl must be positive")
        _check(self.cg_iters >= 1, "cg_iters must be at least 1")
        _check(self.cg_damping >= 0, "cg_damping must be non-negative")
        _check(0 < self.line_search_shrink < 1, "line_search_shrink must be in (0, 1)")
        _check(self.line_search_steps >= 1, "line_search_steps must be at least 1")
        _check(self.fisher_subsample >= 1, "fisher_subsample must be at least 1")
        _check(self.vf_epochs >= 1, "vf_epochs must be at least 1")
        _check(self.vf_minibatch_size >= 1, "vf_minibatch_size must be at least 1")


def conjugate_gradient(matvec: Callable[[Tensor], Tensor], b: Tensor, iters: int, tol: float = 1e-10) -> Tensor:
    """Approximately solve A x = b for symmetric positive-definite A given only x -> A x."""
    x = torch.zeros_like(b)
    r, p = b.clone(), b.clone()
    rr = r @ r
    for _ in range(iters):
        ap = matvec(p)
        alpha = rr / (p @ ap)
        x += alpha * p
        r -= alpha * ap
        new_rr = r @ r
        if new_rr < tol:
            break
        p = r + (new_rr / rr) * p
        rr = new_rr
    return x


def flat(tensors: Iterable[Tensor]) -> Tensor:
    """Parameters or their gradients as one vector, in order. The Nature network's convolutions
    are channels-last, which torch's parameters_to_vector cannot view."""
    return torch.cat([t.reshape(-1) for t in tensors])


def set_flat(params: list[Tensor], vector: Tensor) -> None:
    """Copy ``vector`` into ``params`` in place, each keeping its memory layout (torch's
    vector_to_parameters would swap a channels-last weight for a contiguous one)."""
    at = 0
    for p in params:
        p.copy_(vector[at:at + p.numel()].view(p.shape))
        at += p.numel()


def mean_kl(old: Distribution, new: Distribution) -> Tensor:
    """Mean over states of KL(old || new), summed over action dimensions."""
    kl = kl_divergence(old, new)
    return (kl.sum(-1) if kl.dim() > 1 else kl).mean()


class TRPOLearner(OnPolicyLearner):
    """Natural-gradient policy step under a KL bound, then value regression."""

    def __init__(self, config: TRPOConfig, obs_space, action_space, store, policy_id: str = "default"):
        super().__init__(config, obs_space, action_space, store, policy_id)
        m = self.policy
        # the value function's: the critic's head, on the shared encoder's features as they are, or
        # with the critic's own encoder
        critic = [m.critic] if m.critic_encoder is None else [m.critic_encoder, m.critic]
        self.critic_params = [p for module in critic for p in module.parameters()]
        # the natural gradient's: the rest (the shared encoder's among them)
        fitted = {id(p) for p in self.critic_params}
        self.actor_params = [p for p in m.parameters() if id(p) not in fitted]
        self.optimizer = torch.optim.Adam(self.critic_params, lr=config.lr, eps=config.optimizer_eps)

    def surrogate(self, obs: Tensor, actions: Tensor, old_logp: Tensor, adv: Tensor) -> Tensor:
        """E[pi(a|s) / pi_old(a|s) * A] plus the entropy bonus: what the step maximises."""
        logp, entropy = self.policy.evaluate_actions(obs, actions)
        return ((logp - old_logp).exp() * adv).mean() + self.config.ent_coef * entropy.mean()

    def policy_step(self, obs: Tensor, actions: Tensor, adv: Tensor) -> dict[str, float]:
        """One KL-constrained natural-gradient step of the actor; returns what it did."""
        c, m, params = self.config, self.policy, self.actor_params
        with torch.no_grad():
            old_dist = m.dist(obs)
            old_logp, _ = m.evaluate_actions(obs, actions)
        surr = self.surrogate(obs, actions, old_logp, adv)
        g = flat(torch.autograd.grad(surr, params))
        every = c.fisher_subsample  # the Fisher's states
        with torch.no_grad():
            old_sub = old_dist if every == 1 else m.dist(obs[::every])
        kl_grad = flat(torch.autograd.grad(mean_kl(old_sub, m.dist(obs[::every])), params, create_graph=True))

        def fisher_vector(v: Tensor) -> Tensor:
            return flat(torch.autograd.grad(kl_grad @ v, params, retain_graph=True)) + c.cg_damping * v

        direction = conjugate_gradient(fisher_vector, g, c.cg_iters)
        quad = float(direction @ fisher_vector(direction))  # x^T F x
        if not math.isfinite(quad) or quad <= 0:
            return {"learner/kl": 0.0, "learner/step_accepted": 0.0, "learner/line_search_steps": 0.0,
                    "loss/policy": -float(surr.detach())}
        full_step = direction * math.sqrt(2 * c.max_kl / quad)  # 0.5 s^T F s = max_kl
        old = flat(params).detach()
        surr_old = float(surr.detach())
        with torch.no_grad():
            for k in range(c.line_search_steps):
                set_flat(params, old + c.line_search_shrink**k * full_step)
                kl = float(mean_kl(old_dist, m.dist(obs)))
                surr_new = float(self.surrogate(obs, actions, old_logp, adv))
                if kl <= c.max_kl and surr_new > surr_old:
                    return {"learner/kl": kl, "learner/step_accepted": 1.0, "learner/line_search_steps": k + 1.0,
                            "loss/policy": -surr_new}
            set_flat(params, old)  # no step satisfied both: keep the old policy
        return {"learner/kl": 0.0, "learner/step_accepted": 0.0,
                "learner/line_search_steps": float(c.line_search_steps), "loss/policy": -surr_old}

    def learn(self, rollouts: list[Rollout]) -> dict[str, float]:
        c, m = self.config, self.policy
        b = self.gae_batch(rollouts)
        adv = b["adv"]
        if c.normalize_advantages and len(adv) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        metrics = self.policy_step(b["obs"], b["actions"], adv)
        lr = self.scheduled_lr(self.optimizer)
        losses = []
        if m.critic_encoder is None:
            with torch.no_grad():  # the policy step's encoder: the value regression leaves it alone
                features = m.encoder(b["obs"])
            value = lambda idx: m.critic(features[idx]).squeeze(-1)  # noqa: E731
        else:
            value = lambda idx: m.value(b["obs"][idx])  # noqa: E731
        for _ in range(c.vf_epochs):
            for idx, _ in self.minibatches(b, c.vf_minibatch_size):
                loss = 0.5 * (value(idx) - b["ret"][idx]).pow(2).mean()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                clip_grad_norm(self.critic_params, c.max_grad_norm)
                self.optimizer.step()
                losses.append(loss.detach())
        self.merge_obs_stats(rollouts)
        return read_metrics({**metrics, "loss/value": torch.stack(losses).mean(), "learner/lr": lr,
                             "learner/explained_variance": explained_variance(b["values"], b["ret"])})


register(AlgoSpec("trpo", TRPOConfig, TRPOLearner, make_actor_critic, "sync",
                  "Trust Region Policy Optimization, discrete, continuous and multi-discrete actions"))
