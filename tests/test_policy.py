"""Policy pieces: the normaliser's merge, the fast log-prob path, deployment ``act``, gradient clipping."""

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Normal

from shoal.errors import ShoalError
from shoal.learner import clip_grad_norm
from shoal.policy import ActorCritic, Moments, Policy, RunningNorm


def test_running_norm_merges_batches_like_one_big_batch():
    rng = np.random.default_rng(1)
    parts = [rng.normal(3.0, 2.0, size=(n, 3)) for n in (5, 50, 17)]
    norm = RunningNorm((3,))
    for p in parts:
        norm.update(Moments.of(p))
    allx = np.concatenate(parts)
    np.testing.assert_allclose(norm.mean.numpy(), allx.mean(0), rtol=1e-4)
    np.testing.assert_allclose(norm.var.numpy(), allx.var(0), rtol=1e-4)


def test_fast_log_prob_paths_match_torch_distributions():
    torch.manual_seed(0)
    box = gym.spaces.Box(-1, 1, (3,))
    for action_space in (gym.spaces.Discrete(4), gym.spaces.Box(-2, 2, (2,))):
        m = ActorCritic(box, action_space)
        with torch.no_grad():  # make the log std non-trivial
            if not m.discrete:
                m.log_std.fill_(-0.3)
        x = torch.randn(7, 3)
        d = m.dist(x)
        a = m.act(x, deterministic=False, generator=torch.Generator().manual_seed(0))
        mode = d.probs.argmax(-1) if m.discrete else d.mean
        torch.testing.assert_close(m.act(x, deterministic=True), mode)
        again = torch.Generator().manual_seed(0)  # the same draw as torch's own sampling from d
        drawn = (torch.multinomial(d.probs, 1, generator=again).squeeze(-1) if m.discrete
                 else d.mean + d.stddev * torch.randn(d.mean.shape, generator=again))
        torch.testing.assert_close(a, drawn)
        logp, ent = m.evaluate_actions(x, a)
        explored, explored_logp = m.explore(x, torch.Generator().manual_seed(1))
        torch.testing.assert_close(explored_logp, m.evaluate_actions(x, explored)[0])
        ref = Categorical(logits=m.actor(x)) if m.discrete else Normal(m.actor(x), m.log_std.exp())
        ref_logp = ref.log_prob(a) if m.discrete else ref.log_prob(a).sum(-1)
        ref_ent = ref.entropy() if m.discrete else ref.entropy().sum(-1)
        torch.testing.assert_close(logp, ref_logp)
        torch.testing.assert_close(ent, ref_ent)


def test_act_accepts_one_observation_or_a_batch_and_respects_bounds():
    obs_space = gym.spaces.Box(-1, 1, (3,))
    policy = Policy(ActorCritic(obs_space, gym.spaces.Box(-0.5, 0.5, (2,)), log_std_init=2.0))
    one = policy.act(np.zeros(3, np.float32), deterministic=False, generator=torch.Generator().manual_seed(0))
    batch = policy.act(np.zeros((5, 3), np.float32), deterministic=False)
    assert one.shape == (2,) and batch.shape == (5, 2)
    assert np.all(np.abs(batch) <= 0.5) and np.all(np.abs(one) <= 0.5)
    discrete = Policy(ActorCritic(obs_space, gym.spaces.Discrete(3)))
    assert discrete.act(np.zeros(3)).shape == () and discrete.act(np.zeros((4, 3))).shape == (4,)
    for wrong in (np.zeros(4), np.zeros((2, 4)), np.zeros((2, 2, 3)), np.zeros(())):
        with pytest.raises(ShoalError, match=r"this policy takes one of shape \(3,\) or a batch of shape \(N, 3\)"):
            discrete.act(wrong)


@pytest.mark.parametrize("action_space", [gym.spaces.Discrete(3), gym.spaces.Box(-0.5, 0.5, (2,)),
                                          gym.spaces.MultiDiscrete([2, 3])], ids=["discrete", "box", "multi-discrete"])
def test_an_empty_batch_gets_no_actions_and_a_recurrent_policy_keeps_its_memory(action_space):
    """A caller stepping only the envs still running may, at the end, have none."""
    policy = Policy(ActorCritic(gym.spaces.Box(-1, 1, (3,)), action_space, lstm_size=4))
    two = policy.act(np.ones((2, 3), np.float32))
    memory = [m.clone() for m in policy.module.memory]
    actions = policy.act(np.zeros((0, 3), np.float32))
    assert actions.shape == (0, *action_space.shape) and actions.dtype == two.dtype
    assert all(torch.equal(a, b) for a, b in zip(memory, policy.module.memory))


def test_observations_that_are_not_finite_get_no_action_and_a_line_naming_them():
    """The policy server refuses them on the wire; in-process, argmax over NaN logits would have
    answered 0, silently."""
    policy = Policy(ActorCritic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2)))
    with pytest.raises(ShoalError, match=r"^the observation holds nan: a policy gives no action for an observation "
                                         r"that is not finite"):
        policy.act(np.array([0.0, np.nan, 0.0]))
    batch = np.zeros((8, 3))
    batch[2, 0], batch[5, 1], batch[5, 2] = np.inf, np.nan, -np.inf
    with pytest.raises(ShoalError, match=r"^observations 2, 5 of 8 hold -inf, inf and nan: "):
        policy.act(batch)
    batch[5] = 0.0
    with pytest.raises(ShoalError, match=r"^observation 2 of 8 holds inf: "):
        policy.act(batch)


def test_a_policy_acts_on_read_only_arrays_without_torchs_warning():
    """Arrays decoded from bytes (``np.frombuffer``, as a caller reading observations off a network
    gets them) are read-only; ``act`` must copy them, not make a tensor over them, which torch
    warns of once a process (hence a fresh one, with warnings as errors)."""
    code = (
        "import gymnasium as gym, numpy as np\n"
        "from shoal.policy import ActorCritic, Policy\n"
        "def read_only(shape):\n"
        "    return np.frombuffer(np.zeros(shape, np.float32).tobytes(), np.float32).reshape(shape)\n"
        "box = gym.spaces.Box(-1, 1, (3,))\n"
        "Policy(ActorCritic(box, gym.spaces.Discrete(2))).act(read_only((2, 3)))\n"
        "recurrent = Policy(ActorCritic(box, gym.spaces.Discrete(2), lstm_size=4))\n"
        "recurrent.act_with_memory(np.zeros((2, 3), np.float32), (read_only((2, 8)), read_only((2, 8))))\n")
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_dqn_initial_priorities_are_the_actor_copys_td_errors():
    from shoal.algos.dqn import QNetwork

    torch.manual_seed(0)
    q = QNetwork(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3), (8,), "relu", dueling=False)
    obs, nxt = torch.randn(5, 2), torch.randn(5, 2)
    actions, rewards, discounts = torch.tensor([0, 1, 2, 0, 1]), torch.randn(5), torch.tensor([0.9, 0, 0.9, 0.9, 0.81])
    with torch.no_grad():
        expected = [abs(float(rewards[i] + discounts[i] * q(nxt[i:i + 1]).max() - q(obs[i:i + 1])[0, actions[i]]))
                    for i in range(5)]
    # atol: float32 rounding of Q-values near 1 (a TD error near 0 differed by 1.5e-8 on an AVX2 machine).
    np.testing.assert_allclose(q.initial_priorities(obs, actions, rewards, nxt, discounts).numpy(), expected,
                               rtol=1e-5, atol=1e-6)


def test_a_learner_flushes_denormals_in_its_thread():
    """Adam's decaying second moments turn denormal; roles flush them to zero (set_up_torch)."""
    from shoal.algos.dqn import DQNConfig, DQNLearner
    from shoal.envs import env_spaces
    from shoal.weights import WeightStore

    tiny = torch.tensor([1e-30])
    torch.set_flush_denormal(False)
    try:
        assert (tiny * 1e-10).item() > 0  # 1e-40 is a denormal float32, kept as one
        DQNLearner(DQNConfig(env="CartPole-v1"), *env_spaces("CartPole-v1"), WeightStore())
        assert (tiny * 1e-10).item() == 0.0
    finally:
        torch.set_flush_denormal(True)


def test_clip_grad_norm_scales_as_torch_does_and_only_when_it_must():
    for max_norm in (1e-3, 0.5, 1e9):  # clipped hard, clipped, left alone
        torch.manual_seed(0)
        nets = [torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)) for _ in "ab"]
        nets[1].load_state_dict(nets[0].state_dict())
        x = torch.randn(64, 4)
        for net in nets:
            net(x).pow(2).sum().backward()
        before = [p.grad.clone() for p in nets[1].parameters()]
        theirs = torch.nn.utils.clip_grad_norm_(nets[0].parameters(), max_norm)
        ours = clip_grad_norm(nets[1].parameters(), max_norm)
        assert ours == theirs
        for p, q, g in zip(nets[0].parameters(), nets[1].parameters(), before):
            assert torch.equal(p.grad, q.grad)
            assert torch.equal(q.grad, g) == (max_norm > float(ours))  # scaled exactly when over max_norm


@pytest.mark.parametrize("space", [gym.spaces.Discrete(5, start=2), gym.spaces.MultiDiscrete([3, 4, 2], start=[-1, 0, 5]),
                                   gym.spaces.MultiBinary([2, 3])], ids=["discrete", "multi-discrete", "multi-binary"])
def test_integer_observations_one_hot_as_gymnasium_flattens_them(space):
    from shoal.policy import one_hot

    space.seed(0)
    raw = np.stack([np.asarray(space.sample()) for _ in range(7)])
    flat = np.stack([gym.spaces.flatten(space, x) for x in raw]).astype(np.float32)
    shape = (gym.spaces.flatdim(space),)
    np.testing.assert_array_equal(one_hot(space, raw, shape), flat)  # a batch
    np.testing.assert_array_equal(one_hot(space, raw[3], shape), flat[3])  # one
    bad = raw.copy()
    bad[4] = (space.start + space.n) if isinstance(space, gym.spaces.Discrete) else 2 + np.zeros_like(raw[4])
    with pytest.raises(ShoalError, match=r"(observation|element|values) .*(not in|are 0 or 1)"):
        one_hot(space, bad, shape)


@pytest.mark.parametrize("env_id", ["FrozenLake-v1", "Blackjack-v1"])
def test_a_policy_takes_observations_as_its_env_gives_them_when_shoal_flattened_them(env_id):
    """FrozenLake gives an int and Blackjack a tuple; the network takes their one-hot vectors.
    policy.act takes either, one at a time or as a list, and gives the same actions."""
    from types import SimpleNamespace

    from shoal.envs import env_spaces

    obs_space, action_space = env_spaces(env_id)
    torch.manual_seed(0)
    policy = Policy(ActorCritic(obs_space, action_space), config=SimpleNamespace(env=env_id))
    env = gym.make(env_id)
    raw = [env.reset(seed=s)[0] for s in range(6)]
    flat = np.stack([gym.spaces.flatten(env.observation_space, o) for o in raw])
    expected = policy.act(flat)
    assert [policy.act(o) for o in raw] == list(expected)
    assert list(policy.act(raw)) == list(expected)
    with pytest.raises(ShoalError, match="observations of shape"):
        policy.act(np.zeros(3, np.float32))
    if env_id == "FrozenLake-v1":  # integers are states: 16 of them are a batch, not one flat vector
        states = np.arange(16)
        actions = policy.act(states)
        assert actions.shape == (16,)
        np.testing.assert_array_equal(actions, policy.act(np.eye(16, dtype=np.float32)))
        assert list(actions) == [policy.act(int(s)) for s in states]
        with pytest.raises(ShoalError, match=r"observation 16 is not in the env's observation space Discrete\(16\)"):
            policy.act(np.array([3, 16]))


def test_a_policy_whose_env_cannot_be_made_where_it_is_deployed_still_acts(tmp_path, monkeypatch):
    """Integer observations make the policy look up its env's own space; an env that cannot be made
    here (a simulator this machine lacks) leaves it taking flat vectors, not failing each call."""
    from types import SimpleNamespace

    from conftest import user_module

    user_module(tmp_path, monkeypatch, "shoal_absent_env", (
        "import gymnasium as gym\n\n"
        "class Absent(gym.Env):\n"
        "    def __init__(self):\n"
        "        raise ImportError('needs a simulator this machine lacks')\n\n"
        "gym.register('Absent-v0', entry_point=Absent)\n"))
    box = gym.spaces.Box(-1, 1, (3,))
    policy = Policy(ActorCritic(box, gym.spaces.Discrete(2)), config=SimpleNamespace(env="shoal_absent_env:Absent-v0"))
    assert policy.act(np.zeros((2, 3), np.int64)).shape == (2,)
    assert policy.env_observation_space is None


def sde_policy(freq=-1, kind="actor-critic"):
    """A policy exploring with gSDE: an on-policy actor-critic, or SAC's actor (past its random steps)."""
    from shoal.algos.sac import SquashedGaussianActor

    torch.manual_seed(0)
    obs_space, action_space = gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (2,))
    if kind == "actor-critic":
        return ActorCritic(obs_space, action_space, (16, 8), log_std_init=-1.0, sde=freq)
    actor = SquashedGaussianActor(obs_space, action_space, (16, 8), "relu", sde=(-1.0, freq))
    actor.random_actions.fill_(False)
    return actor


def test_gsde_actor_critics_are_gaussians_of_their_features_whose_std_does_not_train_them():
    """a = mu + h theta, theta ~ N(0, sigma^2) per element: a ~ N(mu, sqrt(h^2 sigma^2)) given the
    actor's last hidden features h; the learners' log-probabilities, entropies and distribution
    are that Gaussian's, and the runners' draws report their log-probability under it. The std's
    gradient reaches sigma, not the features (SB3's learn_features=False for PPO and A2C)."""
    m = sde_policy()
    assert not hasattr(m, "log_std") and m.sde.log_std.shape == (8, 2)
    x = torch.randn(64, 3)
    h = m.actor[:-1](x)
    ref = Normal(m.actor(x), (h.pow(2) @ m.sde.log_std.exp().pow(2) + 1e-6).sqrt())
    with torch.no_grad():  # as runners draw them
        a, logp_explored = m.explore(x, torch.Generator().manual_seed(1))
    logp, entropy = m.evaluate_actions(x, a)
    torch.testing.assert_close(logp, ref.log_prob(a).sum(-1))
    torch.testing.assert_close(logp_explored, logp)
    torch.testing.assert_close(entropy, ref.entropy().sum(-1))
    torch.testing.assert_close(m.dist(x).log_prob(a).sum(-1), logp)
    torch.testing.assert_close(m.act(x, deterministic=True), m.actor(x))
    (sigma_grad,) = torch.autograd.grad(entropy.sum(), m.sde.log_std)
    assert sigma_grad.abs().sum() > 0
    hidden = [p for p in m.actor[:-1].parameters()]
    assert all(g is None for g in torch.autograd.grad(entropy.sum(), hidden, allow_unused=True))
    # the actions' log-probability does train the features, through the mean
    assert all(g.abs().sum() > 0 for g in torch.autograd.grad(logp.sum(), hidden))


@pytest.mark.parametrize("freq", [-1, 2])
@pytest.mark.parametrize("kind", ["actor-critic", "sac"])
def test_gsde_policies_hold_each_envs_noise_for_a_rollout_or_sample_freq_steps(kind, freq):
    m, g = sde_policy(freq, kind), torch.Generator().manual_seed(0)
    x = torch.randn(4, 3).repeat(2, 1)  # 8 envs, the second four seeing the first four's observations
    m.start_rollout()
    steps = [m.explore(x, g)[0] for _ in range(3)]
    assert not torch.equal(steps[0][:4], steps[0][4:])  # each env its own matrix
    assert torch.equal(steps[0], steps[1])  # held: the same observation gets the same action
    assert torch.equal(steps[1], steps[2]) == (freq == -1)  # drawn again after sample_freq steps
    m.start_rollout()
    assert not torch.equal(m.explore(x, g)[0], steps[2])  # a rollout draws afresh
    # a learner's or a deployed policy's stochastic actions: one matrix per call, fresh each time
    assert not torch.equal(m.act(x, False, g), m.act(x, False, g))


def test_ortho_init_off_keeps_torchs_default_initialisation():
    box, actions = gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (2,))
    ortho, default = ActorCritic(box, actions, (16, 16)), ActorCritic(box, actions, (16, 16), ortho_init=False)
    w = ortho.actor[-1].weight  # orthogonal rows of gain 0.01, zero biases
    torch.testing.assert_close(w @ w.T, 1e-4 * torch.eye(2))
    assert not ortho.critic[0].bias.any()
    for layer in (default.actor[0], default.actor[-1], default.critic[2]):  # torch's: U(-1/sqrt(fan_in), ..)
        bound = 1 / layer.in_features ** 0.5
        assert layer.weight.abs().max() <= bound and layer.bias.abs().max() <= bound and layer.bias.any()
    assert default.actor[-1].weight.abs().max() > 0.05  # not the 0.01 gain


CPU_WAIT_PROBE = """
import os, subprocess, sys, time
import shoal.learner as learner
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
busy = "import time\\nend = time.monotonic() + 20\\nwhile time.monotonic() < end:\\n    pass"  # ends by itself
hog = subprocess.Popen([sys.executable, "-c", busy]) if sys.argv[1] == "hog" else None  # on the same CPU
learner.CPU_WAIT_WINDOW_S = 1.5
watch = learner.CpuWait()
while watch.poll() is None:  # busy for a window
    pass
print(watch.share)
if hog:
    hog.kill()
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux's CPU affinity and schedstat")
def test_cpu_wait_is_the_share_of_time_a_process_waited_for_its_cpu():
    """A busy process pinned to one CPU waits for it about half the time beside another busy one,
    and hardly at all alone (below the share from which the trainer advises one thread)."""
    from shoal.trainer import CPU_WAIT_ADVICE

    shares = {}
    for case in ("alone", "hog"):
        out = subprocess.run([sys.executable, "-c", CPU_WAIT_PROBE, case], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        shares[case] = float(out.stdout)
    assert shares["alone"] < CPU_WAIT_ADVICE < 0.3 < shares["hog"] < 0.7, shares
