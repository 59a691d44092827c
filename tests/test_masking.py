"""Action masks: an env that says which actions are legal (a Dict observation's ``action_mask``, or
an ``action_masks()`` method) gets only legal actions, from runners, learners' targets,
evaluation, deployment and env servers alike; the learners replay the masked probabilities the
runners sampled from; the gates are learned, from vectors and from pictures, and Taxi, which
unmasked PPO does not learn in 200k steps, with the slow tests."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

import shoal
from shoal.algos import get
from shoal.envs import MaskedBox, describe_space, make_env, space_from_description
from shoal.errors import ShoalError
from shoal.policy import ActorCritic, PolicyModule, UnsupportedMasks


class Episodic(gym.Env):
    """An env whose reset starts the step count and returns ``_observe()``."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}


class Gates(Episodic):
    """Five gates; each step a few are open (the action mask), among them always the one the
    observation names, which pays 1; another open gate pays 0; a closed one -1 and ends the
    episode. ``closed_chosen`` counts closed gates chosen, by every instance in this process."""

    closed_chosen = 0

    def __init__(self, masked: bool = True, n: int = 5):
        self.n, self.masked = n, masked
        inner = gym.spaces.Box(0.0, 1.0, (n,), np.float32)
        self.observation_space = gym.spaces.Dict(
            {"observation": inner, "action_mask": gym.spaces.MultiBinary(n)}) if masked else inner
        self.action_space = gym.spaces.Discrete(n)

    def _observe(self):
        self.target = int(self.np_random.integers(self.n))
        self.open = self.np_random.random(self.n) < 0.3
        self.open[self.target] = True
        obs = np.eye(self.n, dtype=np.float32)[self.target]
        return {"observation": obs, "action_mask": self.open.astype(np.int8)} if self.masked else obs

    def step(self, action):
        self.t += 1
        if not self.open[int(action)]:
            Gates.closed_chosen += 1
            return self._observe(), -1.0, True, False, {}
        reward = float(int(action) == self.target)  # before the next observation draws the next target
        return self._observe(), reward, False, self.t >= 10, {}


class PictureGates(Gates):
    """The gates, the target shown only in a picture: an 8x8 grey image whose row ``target`` is
    lit (a Dict of it and the mask); with ``vector``, a Dict of the picture, a vector (the step
    count, which does not tell the target) and the mask; with ``method``, the picture alone and the
    mask from ``action_masks()``."""

    def __init__(self, vector: bool = False, method: bool = False):
        super().__init__()
        self.vector, self.method = vector, method
        picture = gym.spaces.Box(0, 255, (8, 8, 1), np.uint8)
        entries = {"picture": picture, **({"step": gym.spaces.Box(0.0, 10.0, (1,), np.float32)} if vector else {})}
        self.observation_space = picture if method else gym.spaces.Dict(
            {**entries, "action_mask": gym.spaces.MultiBinary(self.n)})

    def _observe(self):
        mask = super()._observe()["action_mask"]
        picture = np.zeros((8, 8, 1), np.uint8)
        picture[self.target] = 255
        if self.method:
            return picture
        return {"picture": picture, **({"step": np.array([self.t], np.float32)} if self.vector else {}),
                "action_mask": mask}

    def action_masks(self):
        return self.open


class Dials(Episodic):
    """MultiDiscrete([3, 4]) actions; each step some values of each dial are allowed (an
    ``action_masks()`` method, 7 entries: the first dial's 3, then the second's 4). Choosing a
    value not allowed counts in ``forbidden``; the reward is the dials' sum."""

    forbidden = 0

    def __init__(self):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (7,), np.float32)
        self.action_space = gym.spaces.MultiDiscrete([3, 4])

    def _observe(self):
        self.allowed = self.np_random.random(7) < 0.4
        for lo, hi in ((0, 3), (3, 7)):  # at least one value of each dial
            if not self.allowed[lo:hi].any():
                self.allowed[lo + int(self.np_random.integers(hi - lo))] = True
        return self.allowed.astype(np.float32)

    def action_masks(self):
        return self.allowed

    def step(self, action):
        self.t += 1
        if not (self.allowed[int(action[0])] and self.allowed[3 + int(action[1])]):
            Dials.forbidden += 1
        return self._observe(), float(np.sum(action)), False, self.t >= 10, {}


for env_id, entry, kwargs in (("GatesTest-v0", Gates, {}), ("OpenGatesTest-v0", Gates, {"masked": False}),
                              ("DialsTest-v0", Dials, {}), ("PictureGatesTest-v0", PictureGates, {}),
                              ("PictureVectorGatesTest-v0", PictureGates, {"vector": True}),
                              ("PictureMethodGatesTest-v0", PictureGates, {"method": True})):
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=entry, kwargs=kwargs)


def quick(algo: str, **overrides):
    """A short run's config of ``algo`` that evaluates too."""
    values = dict(env="GatesTest-v0", total_steps=1024, eval_interval=512, eval_episodes=4, progress=False,
                  tensorboard=False, seed=0, torch_threads=1)
    if algo in ("ppo", "a2c", "trpo", "impala", "appo"):
        values.update(num_envs_per_runner=4, rollout_steps=32)
    if algo == "ppo":
        values.update(minibatch_size=64, num_epochs=2)
    if algo in ("dqn", "qrdqn", "sac"):
        values.update(learning_starts=256, batch_size=32, hidden_sizes=(32,))
    values.update(overrides)
    return get(algo).config_cls(**values)


def test_a_dict_observation_with_an_action_mask_is_flattened_with_the_mask_last():
    env = make_env("GatesTest-v0")
    space = env.observation_space
    assert isinstance(space, MaskedBox) and space.shape == (10,) and space.mask_dim == 5
    obs, _ = env.reset(seed=0)
    target = int(obs[:5].argmax())
    assert obs[5 + target] == 1 and set(obs[5:]) <= {0.0, 1.0}
    # checkpoints describe it, and tell it from the plain Box of the same bounds
    again = space_from_description(describe_space(space))
    assert again == space and again.mask_dim == 5 and again != gym.spaces.Box(space.low, space.high)


@pytest.mark.parametrize("env_id, images, vector", [("PictureGatesTest-v0", ((8, 8, 1),), 0),
                                                  ("PictureVectorGatesTest-v0", ((8, 8, 1),), 1),
                                                  ("PictureMethodGatesTest-v0", ((8, 8, 1),), 0)])
def test_pictures_with_an_action_mask_are_laid_out_pixels_first_and_the_mask_last(env_id, images, vector, capsys):
    """An image beside the mask (or a Dict of images and vectors): the pixels as they are, then the
    other entries, then the mask (a MixedBox with a mask), which checkpoints and env servers
    describe as such."""
    from shoal.envs import MixedBox
    from shoal.remote.wire import decode_space, encode_space

    env = make_env(env_id)
    space = env.observation_space
    assert isinstance(space, MixedBox) and space.images == images and space.mask_dim == 5
    assert space.shape == (64 + vector + 5,) and space.pixels == 64
    obs, _ = env.reset(seed=0)
    target = env.unwrapped.target
    assert (obs[:64].reshape(8, 8)[target] == 255).all() and obs[:64].sum() == 8 * 255
    assert obs[64 + vector + target] == 1 and (obs[64 + vector:] == env.unwrapped.open).all()
    for again in (space_from_description(describe_space(space)), decode_space(encode_space(space))):
        assert again == space and again.mask_dim == 5 and again.images == images
    assert space != MixedBox(space.low, space.high, images)  # the same bounds without a mask
    assert "5 action mask entries" in repr(space)
    bad = encode_space(space)
    bad.mask_dim = 64 + vector + 1  # the mask would overlap the pixels
    from shoal.remote.wire import WireError

    with pytest.raises(WireError, match="do not fit in a box"):
        decode_space(bad)
    from shoal.envs import EnvOptions

    with pytest.raises(ShoalError, match="gives an action mask: frame_stack stacks observations without one"):
        make_env(env_id, options=EnvOptions(frame_stack=2))
    from shoal.cli import main

    capsys.readouterr()
    assert main(["check-env", env_id, "--seconds", "0"]) == 0
    out = capsys.readouterr().out
    assert f"{vector} vector entries, 5 action mask entries)" in out and "the action mask's 5 entries last" in out
    assert "trains with: a2c, appo, dqn, impala, ppo, qrdqn, sac, trpo\n" in out, out


def test_a_picture_policy_reads_the_mask_as_the_env_gave_it_whatever_it_normalises():
    """The network's input holds the pixels and the vector as bytes; the legal actions are read from
    its last entries, the mask as the env gave it: normalising the vector leaves the mask alone."""
    space = make_env("PictureVectorGatesTest-v0").observation_space
    m = ActorCritic(space, gym.spaces.Discrete(5), normalize_obs=True, images=True)
    with torch.no_grad():  # statistics that would turn a normalised 1 below 0.5 and a 0 above it
        m.obs_norm.mean.fill_(2.0)
        m.obs_norm.var.fill_(0.25)
    rng = np.random.default_rng(0)
    masks = rng.random((64, 5)) < 0.5
    masks[:, 0] = True
    obs = np.concatenate([rng.integers(0, 256, (64, 64)), rng.random((64, 1)) * 10, masks], 1).astype(np.float32)
    x = m.normalize(torch.as_tensor(obs))
    assert x.dtype == torch.uint8 and torch.equal(m.legal(x), torch.as_tensor(masks))
    actions = m.act(x, False, torch.Generator().manual_seed(0))
    assert masks[np.arange(64), actions.numpy()].all()


@pytest.mark.parametrize("algo, overrides", [
    ("ppo", {"env": "PictureGatesTest-v0"}), ("ppo", {"env": "PictureVectorGatesTest-v0", "normalize_obs": True}),
    ("dqn", {"env": "PictureMethodGatesTest-v0", "updates_per_step": 0.25}),  # (a CNN's updates cost)
    ("sac", {"env": "PictureVectorGatesTest-v0", "updates_per_step": 0.25}),
    ("appo", {"env": "PictureGatesTest-v0"}),
    ("ppo", {}), ("ppo", {"lstm_size": 8}), ("ppo", {"env": "DialsTest-v0"}), ("a2c", {}), ("trpo", {}),
    ("impala", {}), ("appo", {}), ("dqn", {}), ("dqn", {"apex": True, "prioritized": True}), ("qrdqn", {}), ("sac", {}),
    ("dqn", {"normalize_obs": True}),  # the learner's normaliser leaves the mask of replay's raw rows as it is
    ("dqn", {"num_atoms": 11, "v_min": -2.0, "v_max": 2.0, "noisy": True}),  # C51, exploring by noise
    ("ppo", {"inference": "central"}), ("ppo", {"env": "OpenGatesTest-v0"}),
])
def test_runners_and_evaluation_choose_legal_actions_only(algo, overrides, tmp_path):
    """From the first step (an untrained policy, DQN's random actions) to the evaluation episodes.
    The same PPO on the gates without their mask chooses closed ones: the count can fail."""
    Gates.closed_chosen = Dials.forbidden = 0
    summary = shoal.train(quick(algo, **overrides), run_dir=tmp_path / "run")
    assert summary["env_steps"] >= 1024
    illegal = Gates.closed_chosen + Dials.forbidden
    if overrides.get("env") == "OpenGatesTest-v0":
        assert illegal > 20
    else:
        assert illegal == 0


@pytest.mark.parametrize("overrides", [{}, {"lstm_size": 8}, {"env": "DialsTest-v0"}, {"normalize_obs": True}])
def test_the_learner_replays_the_masked_probabilities_the_runner_sampled_from(overrides):
    """Log-probabilities of the rollout's actions by the learner's network, with the same
    weights, equal the runner's: the learner masks as the runner did. A normaliser leaves the
    mask as it is."""
    config = quick("ppo", num_envs_per_runner=4, rollout_steps=64, minibatch_size=128, **overrides)
    with shoal.make(config) as algo:
        learner, runner = algo.learner.obj, algo.runners[0].obj
        rollout = runner.sample(64)
        if config.normalize_obs:  # statistics that would move a mask entry were it normalised
            learner.merge_obs_stats([rollout])
            x = torch.as_tensor(rollout.obs[0])
            np.testing.assert_array_equal(learner.policy.normalize(x)[:, -runner.policy.mask_dim:],
                                          x[:, -runner.policy.mask_dim:])
            assert not torch.equal(learner.policy.normalize(x)[:, :5], x[:, :5])
        batch = learner.gae_batch([rollout])
        with torch.no_grad():
            logp, entropy, _ = learner.evaluate(batch)
        torch.testing.assert_close(logp, batch["logp"], atol=1e-5, rtol=0)
        assert torch.isfinite(entropy).all()
        # an unmasked network gives other probabilities: what the comparison tells apart
        m = copy.deepcopy(learner.policy)
        m.mask_dim = 0
        if not config.lstm_size:
            with torch.no_grad():
                assert not torch.allclose(m.evaluate(batch["obs"], batch["actions"])[0], batch["logp"], atol=1e-3)


def test_impala_corrects_towards_the_masked_policy():
    """V-trace's target log-probabilities (the learner's network) equal the behaviour ones when the
    weights are the same: both masked."""
    with shoal.make(quick("impala")) as algo:
        learner, runner = algo.learner.obj, algo.runners[0].obj
        b = learner.vtrace_batch([runner.sample(32)])
        torch.testing.assert_close(b["logp"], b["behaviour_logp"], atol=1e-5, rtol=0)


def test_dqn_targets_take_the_best_legal_next_action(monkeypatch):
    """The target's max (and double DQN's argmax) runs over the actions legal at the next state."""
    import shoal.algos.dqn as dqn
    from shoal.replay import Transitions

    seen = []
    original = dqn.td_targets
    monkeypatch.setattr(dqn, "td_targets", lambda *a: seen.append(a) or original(*a))
    for double in (True, False):
        with shoal.make(quick("dqn", double=double)) as algo:
            learner = algo.learner.obj
            obs = torch.as_tensor(np.stack([make_env("GatesTest-v0").reset(seed=s)[0] for s in range(64)]))
            next_obs = obs.flip(0).clone()
            legal = next_obs[:, 5:] > 0.5
            with torch.no_grad():
                q_next, q_online = learner.target(next_obs), learner.policy(next_obs)
            # at many next states the unmasked choice is a closed gate
            assert (~legal.gather(1, (q_online if double else q_next).argmax(-1, keepdim=True))).sum() >= 10
            batch = Transitions(obs, torch.zeros(64, dtype=torch.long), torch.zeros(64), next_obs,
                                torch.full((64,), 0.5), torch.ones(64), None)
            seen.clear()
            learner.train_batch(batch)
            (_, _, target_q, online_q), = seen
            chosen = (online_q if double else target_q).argmax(-1, keepdim=True)
            assert legal.gather(1, chosen).all()
            torch.testing.assert_close(target_q.gather(1, chosen), q_next.gather(1, chosen))
            if not double:
                expected = q_next.masked_fill(~legal, -np.inf).max(-1).values
                torch.testing.assert_close(target_q.max(-1).values, expected)


def test_qrdqn_targets_take_the_quantiles_of_the_best_legal_next_action(monkeypatch):
    """The action whose quantiles make the target is the best legal one (by the target's means,
    or with double Q-learning the online network's)."""
    import shoal.algos.qrdqn as qrdqn
    from conftest import record_quantile_losses
    from shoal.replay import Transitions

    seen = record_quantile_losses(monkeypatch, qrdqn)
    for double in (True, False):
        with shoal.make(quick("qrdqn", double=double, n_quantiles=5)) as algo:
            learner = algo.learner.obj
            obs = torch.as_tensor(np.stack([make_env("GatesTest-v0").reset(seed=s)[0] for s in range(64)]))
            next_obs = obs.flip(0).clone()
            legal = next_obs[:, 5:] > 0.5
            with torch.no_grad():
                z_next = learner.target.quantiles(next_obs)
                picker = learner.policy(next_obs) if double else z_next.mean(-1)
            assert (~legal.gather(1, picker.argmax(-1, keepdim=True))).sum() >= 10  # unmasked: often a closed gate
            best = picker.masked_fill(~legal, -np.inf).argmax(-1)
            seen.clear()
            learner.train_batch(Transitions(obs, torch.zeros(64, dtype=torch.long), torch.zeros(64), next_obs,
                                            torch.full((64,), 0.5), torch.ones(64), None))
            torch.testing.assert_close(seen[0][1], 0.5 * z_next[torch.arange(64), best])


def test_c51_targets_take_the_distribution_of_the_best_legal_next_action(monkeypatch):
    """The action whose distribution is projected into the target is the best legal one (by the
    target network's expectations, or with double Q-learning the online network's)."""
    import shoal.algos.dqn as dqn
    from shoal.replay import Transitions

    seen = []
    original = dqn.categorical_targets
    monkeypatch.setattr(dqn, "categorical_targets", lambda *a: seen.append(a) or original(*a))
    for double in (True, False):
        with shoal.make(quick("dqn", double=double, num_atoms=5, v_min=-1.0, v_max=1.0)) as algo:
            learner = algo.learner.obj
            obs = torch.as_tensor(np.stack([make_env("GatesTest-v0").reset(seed=s)[0] for s in range(64)]))
            next_obs = obs.flip(0).clone()
            legal = next_obs[:, 5:] > 0.5
            with torch.no_grad():
                p_next = learner.target.atom_logits(next_obs).softmax(-1)
                picker = learner.policy(next_obs) if double else p_next @ learner.policy.support
            assert (~legal.gather(1, picker.argmax(-1, keepdim=True))).sum() >= 10  # unmasked: often a closed gate
            best = picker.masked_fill(~legal, -np.inf).argmax(-1)
            seen.clear()
            learner.train_batch(Transitions(obs, torch.zeros(64, dtype=torch.long), torch.zeros(64), next_obs,
                                            torch.full((64,), 0.5), torch.ones(64), None))
            torch.testing.assert_close(seen[0][0], p_next[torch.arange(64), best])


def test_sac_discrete_aims_at_the_entropy_the_legal_actions_allow():
    """Its temperature's target is target_entropy_scale x log(legal actions), state by state:
    at 0.9 a near-uniform policy over the legal gates is above it (the temperature falls), where
    0.9 x log(5) would be out of reach (it would rise without bound). A large temperature meets no
    0 x inf: every weight stays finite."""
    from shoal.replay import Transitions

    with shoal.make(quick("sac", target_entropy_scale=0.9)) as algo:
        learner = algo.learner.obj
        obs = torch.as_tensor(np.stack([make_env("GatesTest-v0").reset(seed=s)[0] for s in range(64)]))
        batch = Transitions(obs, torch.zeros(64, dtype=torch.long), torch.zeros(64), obs.flip(0),
                            torch.full((64,), 0.5), torch.ones(64), None)
        before = float(learner.log_alpha.detach())
        learner.train_batch(batch)
        assert float(learner.log_alpha.detach()) < before
        with torch.no_grad():
            learner.log_alpha.fill_(np.log(1e3))
        metrics, _ = learner.train_batch(batch)
        assert all(torch.isfinite(v).all() for v in metrics.values())
        assert all(torch.isfinite(p).all() for p in [*learner.policy.parameters(), *learner.critics.parameters()])


def test_a_deployed_policy_takes_the_mask_in_every_form(tmp_path):
    summary = shoal.train(quick("ppo", total_steps=512), run_dir=tmp_path / "run")
    policy = shoal.load_policy(summary["checkpoint"])
    env = Gates()
    obs = [env.reset(seed=s)[0] for s in range(200)]
    masks = np.stack([o["action_mask"] for o in obs]).astype(bool)
    rows = np.arange(200)
    for deterministic in (True, False):
        gen = torch.Generator().manual_seed(0)
        # the env's own Dict observations, one or a list
        assert masks[0, policy.act(obs[0], deterministic, gen)]
        assert masks[rows, policy.act(obs, deterministic, gen)].all()
        # the observation alone, and the mask given as sb3-contrib's predict takes it
        alone = np.stack([o["observation"] for o in obs])
        assert masks[rows, policy.act(alone, deterministic, gen, action_mask=masks)].all()
        # the flat vector runners see, its mask replaced by action_mask
        flat = np.concatenate([alone, np.ones((200, 5), np.float32)], 1)
        assert masks[rows, policy.act(flat, deterministic, gen, action_mask=masks)].all()
    # the policy server takes the flat vector, and says where its mask is
    from shoal.remote.policyserver import PolicyClient, PolicyServer
    from shoal.remote.wire import decode_space

    server = PolicyServer({"default": tmp_path / "run"}, port=0).start()
    try:
        client = PolicyClient(server.address)
        assert decode_space(client.describe().observation_space).mask_dim == 5
        flat = np.concatenate([alone, masks.astype(np.float32)], 1)
        assert masks[rows, client.act(flat)[0]].all() and masks[rows, client.act(flat, deterministic=False)[0]].all()
    finally:
        server.stop(grace=0)
    # a Dict that is not the env's own is refused in one line
    with pytest.raises(ShoalError, match="a dict observation that is not one of the env's own"):
        policy.act({"observation": obs[0]["observation"]})
    # without a mask every action is allowed; a mask of the wrong size is refused
    assert not masks[rows, policy.act(alone, False, torch.Generator().manual_seed(0))].all()
    with pytest.raises(ShoalError, match="takes 5 entries per observation"):
        policy.act(alone, action_mask=np.ones((200, 4)))
    unmasked = shoal.load_policy(shoal.train(quick("ppo", env="OpenGatesTest-v0", total_steps=256),
                                             run_dir=tmp_path / "open")["checkpoint"])
    with pytest.raises(ShoalError, match="takes no action mask"):
        unmasked.act(alone, action_mask=masks)


def test_a_multi_discrete_mask_applies_per_element():
    m = ActorCritic(MaskedBox(np.zeros(10, np.float32), np.ones(10, np.float32), 7), gym.spaces.MultiDiscrete([3, 4]))
    with torch.no_grad():
        for p in m.actor.parameters():
            p.normal_()
    rng = np.random.default_rng(0)
    allowed = rng.random((500, 7)) < 0.4
    allowed[:, 0] = allowed[:, 3] = True
    x = torch.as_tensor(np.concatenate([rng.random((500, 3)), allowed], 1), dtype=torch.float32)
    legal = torch.as_tensor(allowed)
    for actions in (m.explore(x, torch.Generator().manual_seed(1))[0], m.act(x, True), m.act(x, False)):
        assert legal[torch.arange(500), actions[:, 0]].all() and legal[torch.arange(500), 3 + actions[:, 1]].all()
    logp, entropy = m.evaluate_actions(x, m.act(x, True))
    assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()


def test_envs_that_give_a_mask_shoal_cannot_use_are_refused_in_one_line(tmp_path):
    # every algorithm for discrete actions takes masks; the others say what they need; a policy
    # class that takes none says so
    with pytest.raises(ShoalError, match="td3 needs continuous"):
        shoal.make(quick("td3", learning_starts=10))
    masked = MaskedBox(np.zeros(10, np.float32), np.ones(10, np.float32), 5)
    with pytest.raises(UnsupportedMasks, match="does not take action masks"):
        PolicyModule(masked, gym.spaces.Discrete(5))
    with pytest.raises(ShoalError, match="an action mask of 5 entries does not fit the action space Discrete"):
        ActorCritic(masked, gym.spaces.Discrete(4))

    class Continuous(Gates):
        def __init__(self):
            super().__init__()
            self.action_space = gym.spaces.Box(-1, 1, (5,))

    class Wide(Gates):
        def __init__(self):
            super().__init__()
            self.action_space = gym.spaces.Discrete(4)

    class Shut(Gates):
        def _observe(self):
            obs = super()._observe()
            obs["action_mask"][:] = 0
            return obs

    cases = [(Continuous, "its actions are continuous"), (Wide, "has 5 entries, where its action space Discrete")]
    for cls, message in cases:
        gym.register("RefusedMask-v0", entry_point=cls)
        try:
            with pytest.raises(ShoalError, match=message):
                shoal.make(quick("ppo", env="RefusedMask-v0"))
        finally:
            gym.registry.pop("RefusedMask-v0")
    gym.register("ShutGates-v0", entry_point=Shut)
    try:
        with shoal.make(quick("ppo", env="ShutGates-v0")) as algo:
            with pytest.raises(ShoalError, match="env 0 of ShutGates-v0 gave an action mask that allows no action"):
                algo.runners[0].obj.sample(8)
    finally:
        gym.registry.pop("ShutGates-v0")


def test_an_env_server_serves_the_mask_with_the_observations(tmp_path):
    from shoal.remote.client import RemoteVectorEnv
    from shoal.remote.envserver import EnvServer
    from shoal.remote.wire import WireError, decode_space, encode_space

    space = make_env("GatesTest-v0").observation_space
    assert decode_space(encode_space(space)) == space
    bad = encode_space(space)
    bad.mask_dim = 10  # no observation entry left
    with pytest.raises(WireError, match="a mask ends a flat float32 box"):
        decode_space(bad)
    server = EnvServer("GatesTest-v0", 4).start()
    try:
        remote = RemoteVectorEnv(f"remote://{server.address}")
        assert remote.single_observation_space == space
        remote.close()
        Gates.closed_chosen = 0
        summary = shoal.train(quick("ppo", env=f"remote://{server.address}", eval_interval=0),
                              run_dir=tmp_path / "run")
        assert summary["env_steps"] >= 1024 and Gates.closed_chosen == 0
    finally:
        server.stop(grace=0)
    # the run saw flat vectors only: the env's own Dicts are refused until their space is given
    env = Gates()
    obs = [env.reset(seed=s)[0] for s in range(50)]
    masks = np.stack([o["action_mask"] for o in obs]).astype(bool)
    policy = shoal.load_policy(summary["checkpoint"])
    with pytest.raises(ShoalError, match="trained on remote envs.*env_observation_space=env.observation_space"):
        policy.act(obs[0])
    policy = shoal.load_policy(summary["checkpoint"], env_observation_space=env.observation_space)
    assert masks[np.arange(50), policy.act(obs)].all() and masks[0, policy.act(obs[0])]
    with pytest.raises(ShoalError, match="do not make this policy's input"):
        shoal.load_policy(summary["checkpoint"], env_observation_space=Gates(n=4).observation_space)


def taxi_flat(state: int, mask: np.ndarray) -> np.ndarray:
    """What a policy learns Taxi from with ``info_action_mask``: the state one-hot, then the mask."""
    return np.concatenate([np.eye(500, dtype=np.float32)[state], mask.astype(np.float32)])


def taxi_returns(policy, episodes: int = 20) -> list[float]:
    """The returns of ``policy`` on Taxi, acting on Taxi's own states and the mask Taxi gives in
    ``info``; each action checked against the one it gives for the flat vector it learned from."""
    env = gym.make("Taxi-v4")
    returns = []
    for seed in range(episodes):
        state, info = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            action = int(policy.act(state, action_mask=info["action_mask"]))
            assert info["action_mask"][action] and action == int(policy.act(taxi_flat(state, info["action_mask"])))
            state, r, term, trunc, info = env.step(action)
            total += r
            done = term or trunc
        returns.append(total)
    return returns


@pytest.mark.slow
def test_ppo_learns_taxi_with_its_action_mask(tmp_path):
    """Taxi with the mask it gives in ``info`` (``info_action_mask``), PPO's default settings: 7+
    (~8 at best) by 115k-150k steps on seeds 0 and 1 (~20-30 s; seed 0 at 147k on an Intel Xeon, 44 s
    in the suite: with the slow tests, as CI learns with a mask on the gates), as through an
    ``action_masks()`` method; without the mask PPO was still at -200 (every episode timed out)
    after 200k. Deployed, the policy takes Taxi's own states and the mask Taxi gives in ``info``."""
    config = shoal.PPOConfig(env="Taxi-v4", info_action_mask=True, total_steps=200_000, stop_return=7.0,
                             eval_interval=16384, eval_episodes=10, progress=False, tensorboard=False, seed=0)
    summary = shoal.train(config, run_dir=tmp_path / "run")
    assert summary["best_eval_return"] >= 7.0, summary
    returns = taxi_returns(shoal.load_policy(summary["checkpoint"]))
    # A greedy policy that evaluates 7+ can still go round in circles from a rare start state (seed 0
    # on an Intel Xeon: 19 deliveries, each 5-14, and one -200 timeout): most episodes must deliver,
    # and their median reach the trained level.
    assert sum(r > 0 for r in returns) >= 18 and np.median(returns) >= 6.0, returns


def test_a_taxi_policy_takes_taxis_states_and_the_mask_from_its_info(tmp_path):
    """A short Taxi run with ``info_action_mask``: deployed, the policy takes Taxi's own states and
    the mask from ``info`` and acts as on the flat vector it learned from, legal moves only; the
    policy server has no field for a mask, so Taxi's states alone are refused and the flat vector
    taken."""
    config = shoal.PPOConfig(env="Taxi-v4", info_action_mask=True, total_steps=4096, eval_interval=0,
                             progress=False, tensorboard=False, seed=0)
    summary = shoal.train(config, run_dir=tmp_path / "run")
    policy = shoal.load_policy(summary["checkpoint"])
    taxi_returns(policy, episodes=2)
    env = gym.make("Taxi-v4")
    state, info = env.reset(seed=0)
    from shoal.remote.policyserver import PolicyClient, PolicyServer

    server = PolicyServer({"default": tmp_path / "run"}, port=0).start()
    try:
        client = PolicyClient(server.address)
        with pytest.raises(Exception, match="end with an action mask of 6 entries: send flat vectors of 506"):
            client.act(np.array([state]))
        mask = info["action_mask"]
        assert client.act(taxi_flat(state, mask))[0] == policy.act(state, action_mask=mask)
    finally:
        server.stop(grace=0)


def test_ppo_learns_the_gates_with_their_mask(tmp_path):
    """The vector gates (the target one-hot), a mask each step: 9.5 of 10 by 2k-6k steps (seeds 0-2),
    where an untrained policy, among the open gates, scores ~5.4. (Taxi, which PPO without its mask
    does not learn, runs with the slow tests.)"""
    Gates.closed_chosen = 0
    config = quick("ppo", total_steps=20_000, stop_return=9.5, eval_interval=2048, eval_episodes=10,
                   num_envs_per_runner=8, rollout_steps=64, minibatch_size=128, num_epochs=4)
    summary = shoal.train(config, run_dir=tmp_path / "run")
    assert summary["best_eval_return"] >= 9.5 and Gates.closed_chosen == 0, summary


def test_a_checkpoint_written_before_the_mask_was_read_is_refused_by_resume_and_eval(tmp_path, capsys):
    """A checkpoint of the gates from before shoal read masks took the Dict flattened whole (the
    mask among the entries, 10 of them): a network of the same shape, fed another layout. Resume
    and ``shoal eval`` refuse it in one line, and leave the run as it was."""
    from shoal import checkpoint as ckpt
    from shoal.cli import main

    run = tmp_path / "run"
    summary = shoal.train(quick("ppo", total_steps=256), run_dir=run)
    path = ckpt.resolve(summary["checkpoint"])
    assert main(["eval", str(run), "--episodes", "2"]) == 0
    capsys.readouterr()
    payload = ckpt.read_policy(path)
    payload["obs_space"].pop("mask_dim")
    torch.save(payload, path / ckpt.POLICY_FILE)
    before = sorted(p.name for p in run.rglob("*"))
    for argv in (["eval", str(run), "--episodes", "2"], ["train", "--resume", str(run), "--no-progress"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "does not fit GatesTest-v0: the env gives observations MaskedBox(5 observation entries, 5 action" in err
        assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in run.rglob("*")) == before
    with pytest.raises(ShoalError, match="does not fit GatesTest-v0"):
        shoal.load(path)


def test_ppo_learns_the_gate_a_picture_shows_among_the_legal_ones(tmp_path):
    """The target gate is shown only in the picture: an untrained policy, among the open gates,
    scores ~6.3 of 10, one that reads the picture 10 (9.5+ by 2k-6k steps, seeds 0-2). Deployed,
    the policy takes the env's own Dict observations (the picture and the mask) and chooses open
    gates only."""
    Gates.closed_chosen = 0
    config = quick("ppo", env="PictureGatesTest-v0", total_steps=20_000, stop_return=9.5, eval_interval=2048,
                   eval_episodes=10, num_envs_per_runner=8, rollout_steps=64, minibatch_size=128, num_epochs=4)
    summary = shoal.train(config, run_dir=tmp_path / "run")
    assert summary["best_eval_return"] >= 9.5 and Gates.closed_chosen == 0, summary
    policy = shoal.load_policy(summary["checkpoint"])
    env = PictureGates()
    obs = [env.reset(seed=s)[0] for s in range(100)]
    targets = [int(o["picture"][:, 0, 0].argmax()) for o in obs]
    masks = np.stack([o["action_mask"] for o in obs]).astype(bool)
    actions = policy.act(obs)
    assert masks[np.arange(100), actions].all() and np.mean(actions == targets) >= 0.9
    assert masks[np.arange(100), policy.act(obs, False, torch.Generator().manual_seed(0))].all()
