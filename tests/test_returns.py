"""GAE against a straightforward per-environment reference, with terminated and truncated episodes."""

import numpy as np
import torch

from shoal.returns import gae, next_values


def reference_gae(rewards, values, last_value, final_value_at, terminated, truncated, gamma, lam):
    """Loop over each env's steps backwards, one episode at a time, bootstrapping as the maths says."""
    T, B = rewards.shape
    adv = np.zeros((T, B))
    for b in range(B):
        running = 0.0
        for t in reversed(range(T)):
            if terminated[t, b]:
                v_next, running = 0.0, 0.0
            elif truncated[t, b]:
                v_next, running = final_value_at[(t, b)], 0.0  # time limit: the state had a future
            else:
                v_next = values[t + 1, b] if t + 1 < T else last_value[b]
            delta = rewards[t, b] + gamma * v_next - values[t, b]
            running = delta + gamma * lam * running
            adv[t, b] = running
    return adv


def test_gae_matches_reference_with_terminated_and_truncated_episodes():
    rng = np.random.default_rng(0)
    T, B, gamma, lam = 12, 3, 0.97, 0.9
    rewards, values, last_value = rng.normal(size=(T, B)), rng.normal(size=(T, B)), rng.normal(size=B)
    terminated = np.zeros((T, B), bool)
    truncated = np.zeros((T, B), bool)
    terminated[3, 0] = terminated[11, 2] = True
    truncated[7, 0] = truncated[5, 1] = truncated[11, 1] = True  # incl. a truncation on the last step
    idx = np.argwhere(terminated | truncated)
    final_value = rng.normal(size=len(idx))
    finals = {(int(t), int(b)): v for (t, b), v in zip(idx, final_value)}

    expected = reference_gae(rewards, values, last_value, finals, terminated, truncated, gamma, lam)
    t = lambda x: torch.as_tensor(x)  # noqa: E731
    nxt = next_values(t(values), t(last_value), t(final_value), t(idx), t(terminated), t(truncated))
    adv, ret = gae(t(rewards), t(values), nxt, t(terminated | truncated), gamma, lam)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-10)
    np.testing.assert_allclose(ret.numpy(), expected + values, rtol=1e-10)


def test_truncation_bootstraps_but_termination_does_not():
    # One step, reward 1, V(final) = 10: truncated -> 1 + gamma * 10; terminated -> 1.
    values, last = torch.zeros(1, 2, dtype=torch.float64), torch.full((2,), 99.0, dtype=torch.float64)
    final_idx, final_v = torch.tensor([[0, 0], [0, 1]]), torch.tensor([10.0, 10.0], dtype=torch.float64)
    term, trunc = torch.tensor([[False, True]]), torch.tensor([[True, False]])
    nxt = next_values(values, last, final_v, final_idx, term, trunc)
    _, ret = gae(torch.ones(1, 2, dtype=torch.float64), values, nxt, term | trunc, 0.9, 0.95)
    assert ret.tolist() == [[1 + 0.9 * 10, 1.0]]


def test_lambda_one_gives_discounted_monte_carlo_returns():
    T, gamma = 5, 0.9
    rewards = torch.arange(1, T + 1, dtype=torch.float64)[:, None]
    values = torch.zeros(T, 1, dtype=torch.float64)
    term = torch.zeros(T, 1, dtype=torch.bool)
    term[-1] = True
    nxt = next_values(values, torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64),
                      torch.tensor([[T - 1, 0]]), term, torch.zeros_like(term))
    _, ret = gae(rewards, values, nxt, term, gamma, 1.0)
    expected = [sum(gamma**k * r for k, r in enumerate(range(s + 1, T + 1))) for s in range(T)]
    np.testing.assert_allclose(ret[:, 0].numpy(), expected)
