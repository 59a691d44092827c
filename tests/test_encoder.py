"""Your own feature extractor (``--encoder module:ClassName``, as SB3's features_extractor_class or
an RLlib custom model): every algorithm that takes one builds its networks on it and trains it; a
run with one learns, deploys, exports and resumes; mistakes in it end in one line."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import user_encoders

import shoal
from shoal.algos import get
from shoal.cli import main
from shoal.errors import ConfigError
from shoal.policy import UserEncoder

QUICK = {"progress": False, "tensorboard": False, "eval_episodes": 2}
ON_POLICY = {"num_envs_per_runner": 4, "rollout_steps": 16}
OFF_POLICY = {"learning_starts": 64, "batch_size": 32}


def test_ppo_learns_cartpole_through_your_encoder_and_the_run_deploys_it(tmp_path):
    config = shoal.make_config("ppo", "CartPole-v1", encoder=user_encoders.Tanh, encoder_kwargs={"width": 32},
                               stop_return=475, total_steps=60_000, **QUICK)
    assert config.encoder == "user_encoders:Tanh"  # the class in Python: its import path, for every process
    summary = shoal.train(config, run_dir=tmp_path)
    assert summary["best_eval_return"] >= 475, summary
    policy = shoal.load_policy(tmp_path)  # built anew from the run's config
    assert isinstance(policy.module.encoder.module, user_encoders.Tanh) and policy.module.encoder.out_dim == 32
    assert [layer.in_features for layer in policy.module.actor if isinstance(layer, torch.nn.Linear)] == [32, 64, 64]


CASES = {
    "ppo-lstm": ("ppo", "CartPole-v1", {**ON_POLICY, "lstm_size": 8, "minibatch_size": 32}),
    "a2c": ("a2c", "CartPole-v1", ON_POLICY),
    "trpo": ("trpo", "CartPole-v1", ON_POLICY),
    "appo": ("appo", "CartPole-v1", ON_POLICY),
    "dqn-dueling": ("dqn", "CartPole-v1", {**OFF_POLICY, "dueling": True}),
    "sac": ("sac", "Pendulum-v1", OFF_POLICY),
    "sac-discrete": ("sac", "CartPole-v1", OFF_POLICY),
    "td3": ("td3", "Pendulum-v1", OFF_POLICY),
    "ddpg": ("ddpg", "Pendulum-v1", OFF_POLICY),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_algorithm_that_takes_an_encoder_trains_yours(case):
    algo, env, sets = CASES[case]
    config = get(algo).config_cls(env=env, encoder="user_encoders:Tanh", encoder_kwargs={"width": 16},
                                  hidden_sizes=(24,), **sets, **QUICK)
    with shoal.make(config) as run:
        before = run.get_policy().module
        assert isinstance(before.encoder, UserEncoder) and before.feature_dim == 16
        while run.env_steps < 256:
            run.train()
        after = run.get_policy().module
    moved = [not torch.equal(a, b) for a, b in zip(before.encoder.parameters(), after.encoder.parameters())]
    assert moved and all(moved), case


def test_images_reach_your_encoder_as_floats_in_0_1_with_the_algorithms_mlp_after_it():
    """shoal's own CNN takes the place of the hidden layers on images (linear heads on its 512
    units, as the Nature network); yours is followed by hidden_sizes, as SB3 puts net_arch after a
    features extractor of yours."""
    images = gym.spaces.Box(0, 255, (7, 7, 3), np.uint8)
    for algo in ("ppo", "trpo", "dqn", "sac"):
        config = get(algo).config_cls(env="CartPole-v1", encoder="user_encoders:SmallCNN", hidden_sizes=(24,))
        actions = gym.spaces.Discrete(3)
        module = get(algo).make_policy(config, images, actions)
        assert module.encoder.module.training  # in train mode again after shoal's call on zeros
        seen = []
        module.encoder.module.register_forward_pre_hook(lambda _, inputs: seen.append(inputs[0]))
        module.act(torch.full((5, 3, 7, 7), 255, dtype=torch.uint8), deterministic=True)
        assert seen[0].dtype == torch.float32 and float(seen[0].max()) == 1.0, algo
        widths = [m.out_features for m in module.modules() if isinstance(m, torch.nn.Linear)]
        assert 24 in widths, (algo, widths)


@pytest.mark.parametrize("algo", ["ppo", "a2c", "trpo", "appo"])
def test_an_on_policy_critic_with_an_encoder_of_its_own_is_trained_by_the_value_loss_only(algo):
    """--no-share-encoder (SB3's share_features_extractor=False): the critic reads an encoder of
    its own, of the actor's kind. The value loss trains it and not the actor's; acting runs the
    actor's alone; a run trains both."""
    config = get(algo).config_cls(env="CartPole-v1", encoder="user_encoders:Tanh", encoder_kwargs={"width": 16},
                                  share_encoder=False, **ON_POLICY, **QUICK,
                                  **({"minibatch_size": 32} if algo == "ppo" else {}))
    with shoal.make(config) as run:
        before = run.get_policy().module
        actor, critic = before.encoder, before.critic_encoder
        assert isinstance(critic, UserEncoder) and critic.out_dim == 16 and critic is not actor
        seen = []
        critic.register_forward_pre_hook(lambda *_: seen.append(1))
        obs = torch.randn(8, 4)
        before.act(obs, deterministic=False)
        before.explore(obs, None)
        assert not seen  # acting: the actor's encoder only
        before.value(obs).sum().backward()
        assert all(p.grad is None for p in actor.parameters())
        assert all(p.grad is not None for p in critic.parameters())
        before.zero_grad(set_to_none=True)
        before.evaluate_actions(obs, torch.zeros(8))[0].sum().backward()
        assert all(p.grad is None for p in critic.parameters())
        while run.env_steps < 256:
            run.train()
        after = run.get_policy().module
    for old, new in ((actor, after.encoder), (critic, after.critic_encoder)):
        moved = [not torch.equal(a, b) for a, b in zip(old.parameters(), new.parameters())]
        assert moved and all(moved), (algo, old)


def test_a_recurrent_critic_with_an_encoder_of_its_own_reads_that_encoder_through_its_lstm():
    """Each LSTM reads its own encoder's half of the features: the critic's value trains the
    critic's encoder alone, the actor's log-probabilities the actor's."""
    config = get("ppo").config_cls(env="CartPole-v1", encoder="user_encoders:Tanh", encoder_kwargs={"width": 16},
                                   share_encoder=False, lstm_size=8)
    module = get("ppo").make_policy(config, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2))
    h = module.features(torch.randn(8, 4))  # one step of both LSTMs from a zero memory
    moved = lambda part: [p.grad is not None and bool(p.grad.any()) for p in part.parameters()]  # noqa: E731
    # the LSTMs' outputs are concatenated: the other LSTM's gradient is 0, not None
    module.critic_value(h).sum().backward(retain_graph=True)
    assert not any(moved(module.encoder)) and all(moved(module.critic_encoder))
    module.zero_grad(set_to_none=True)
    module.heads(h, torch.zeros(8))[0].sum().backward()
    assert all(moved(module.encoder)) and not any(moved(module.critic_encoder))


@pytest.mark.parametrize("ortho_init", [True, False])
def test_your_encoders_initialisation_is_kept_with_or_without_orthogonal_init(ortho_init):
    """--no-ortho-init (rl-zoo's gSDE presets set it) gives shoal's layers torch's default
    initialisation; it reset the layers of your encoder too, whatever its class had done."""
    config = get("ppo").config_cls(env="Pendulum-v1", encoder="user_encoders:HalfInit", ortho_init=ortho_init,
                                   share_encoder=False)
    module = get("ppo").make_policy(config, gym.spaces.Box(-1, 1, (3,), np.float32),
                                    gym.spaces.Box(-1, 1, (1,), np.float32))
    for encoder in (module.encoder, module.critic_encoder):
        assert torch.equal(encoder.module.net[0].weight, torch.full((64, 3), 0.5))
    # shoal's own layers: the actor's last orthogonal with gain 0.01, or torch's U(-1/8, 1/8) on 64 inputs
    assert bool(module.actor[-1].weight.abs().max() > 0.05) != ortho_init


@pytest.mark.parametrize("inference", ["local", "central"])
def test_copies_that_act_are_in_eval_mode_so_your_batch_norm_acts_on_one_env(tmp_path, inference):
    """Runners, the evaluator and central inference servers act in eval mode (as SB3's rollouts):
    an --encoder's batch norm reads the running statistics the learner publishes, and its dropout
    is off. In train mode a runner of one env failed at its first step (batch norm cannot
    normalise one row by its own statistics)."""
    config = shoal.make_config("ppo", "CartPole-v1", encoder="user_encoders:BatchNormed", num_envs_per_runner=1,
                               rollout_steps=32, minibatch_size=32, total_steps=128, eval_episodes=1,
                               inference=inference, progress=False, tensorboard=False)
    summary = shoal.train(config, run_dir=tmp_path)
    assert summary["env_steps"] == 128
    with shoal.make(config) as run:
        run.train()
        learner = run.learner.obj
        if inference == "central":  # the server acts for the runners
            acts = run.inference[0].obj
            acts._sync()  # what it does before each batch
        else:
            acts = run.runners[0].obj
            acts.sync_weights()  # what it does before each rollout
        assert not acts.policy.training and learner.policy.training
        learned, acting = (r.policy.encoder.module.net[1].running_mean for r in (learner, acts))
        assert learned.abs().sum() > 0 and torch.equal(learned, acting)  # the learner's statistics, published


@pytest.mark.parametrize("algo", ["ppo", "appo"])
def test_a_learner_estimates_from_values_and_log_probabilities_in_eval_mode(algo):
    """The values GAE and V-trace read, and V-trace's target log-probabilities, come from the
    network in eval mode, as the runners act (SB3 computes values in its rollouts): a dropout in
    your encoder does not draw noise into them. Training goes on in train mode."""
    from shoal.policy import eval_mode

    config = get(algo).config_cls(env="CartPole-v1", encoder="user_encoders:Dropped", **ON_POLICY, **QUICK,
                                  **({"minibatch_size": 32} if algo == "ppo" else {}))
    with shoal.make(config) as run:
        learner, runner = run.learner.obj, run.runners[0].obj
        rollout = runner.sample(16)
        m = learner.policy
        obs = torch.as_tensor(rollout.obs.reshape(64, 4))
        batch = learner.vtrace_batch([rollout]) if algo == "appo" else learner.stack([rollout])
        assert m.training and m.encoder.module.net[2].training  # back in train mode
        with torch.no_grad(), eval_mode(m):
            torch.testing.assert_close(batch["values"].reshape(-1), m.value(obs))
            if algo == "appo":
                torch.testing.assert_close(batch["logp"], m.evaluate_actions(obs, batch["actions"])[0])


def test_off_policy_critics_read_an_encoder_of_their_own_trained_by_the_critic_loss_only():
    from shoal.algos.sac import SACConfig, SACLearner
    from shoal.replay import Transitions
    from shoal.weights import WeightStore

    config = SACConfig(env="Pendulum-v1", encoder="user_encoders:Tanh", encoder_kwargs={"width": 8},
                       hidden_sizes=(16,), learning_starts=0)
    learner = SACLearner(config, gym.spaces.Box(-8, 8, (3,)), gym.spaces.Box(-2, 2, (1,)), WeightStore())
    critics, actor = learner.critics.encoder, learner.policy.encoder
    assert isinstance(critics, UserEncoder) and critics is not actor
    n = 16
    g = torch.Generator().manual_seed(0)
    b = Transitions(obs=torch.randn(n, 3, generator=g), actions=torch.rand(n, 1, generator=g) * 2 - 1,
                    rewards=torch.randn(n, generator=g), next_obs=torch.randn(n, 3, generator=g),
                    discounts=torch.full((n,), 0.99), weights=torch.ones(n), indices=np.arange(n))
    learner.optimizer.zero_grad()
    features = learner.critics.encode(b.obs)
    a, _ = learner.policy.sample(b.obs)
    # the actor's loss through the critics (their weights detached, as SAC's step takes it)
    learner.critics(features.detach(), a, detach_weights=True, encoded=True).sum().backward()
    assert all(p.grad is None for p in critics.parameters())
    assert all(p.grad is not None for p in actor.parameters())
    learner.critics(b.obs, b.actions).sum().backward()
    assert all(p.grad is not None for p in critics.parameters())


def test_a_resume_with_another_encoder_is_refused_and_with_the_same_one_goes_on(tmp_path, capsys):
    run = tmp_path / "run"
    fast = ["--no-progress", "--no-tensorboard", "--num-envs-per-runner", "4", "--rollout-steps", "16",
            "--minibatch-size", "32", "--num-epochs", "1", "--eval-episodes", "2"]
    assert main(["train", "ppo", "--env", "CartPole-v1", "--encoder", "user_encoders:Tanh", "--encoder-kwargs",
                 "width=16", "--total-steps", "64", "--run-dir", str(run), *fast]) == 0
    saved = (run / "config.yaml").read_text()
    assert "encoder: user_encoders:Tanh" in saved and "width: 16" in saved
    capsys.readouterr()
    # another class with the same parameter names and shapes: the state dict alone would take it
    for change in (["--set", "encoder=null", "encoder_kwargs={}"], ["--encoder", "user_encoders:Tanh2"]):
        code = main(["train", "--resume", str(run), "--total-steps", "128", *change, *fast])
        err = capsys.readouterr().err
        assert code == 2 and "holds a network with --encoder user_encoders:Tanh" in err, err
        assert (run / "config.yaml").read_text() == saved
    assert main(["train", "--resume", str(run), "--total-steps", "128", *fast]) == 0


@pytest.mark.parametrize("args, message", [
    (["--encoder", "user_encoders"], "--encoder takes 'module:ClassName'"),
    (["--encoder", "no_such_module_here:Enc"], "--encoder no_such_module_here:Enc: cannot import 'no_such_module_here'"),
    (["--encoder", "user_encoders:Nope"], "user_encoders holds nothing by the name 'Nope'"),
    (["--encoder", "user_encoders:NOT_A_MODULE"], "holds a int by the name 'NOT_A_MODULE', not a torch.nn.Module"),
    (["--encoder", "user_encoders:Raises"], "Raises(input_space, **{}) raised ValueError: no encoder today"),
    (["--encoder", "user_encoders:FlatOutput"], "it must return float features [N, K] for inputs ['N', 4]; it "
                                               "returned [2] for N = 2"),
    (["--encoder", "user_encoders:TenInputs"], "its forward pass on a batch of zeros [2, 4] raised RuntimeError"),
    (["--encoder-kwargs", "width=8"], "give --encoder module:ClassName too"),
    (["--encoder", "user_encoders:Tanh", "--encoder-kwargs", "depth=2"], "raised TypeError"),
])
def test_a_mistaken_encoder_is_one_line_and_writes_no_run(args, message, tmp_path, capsys):
    code = main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(tmp_path / "run"), "--no-progress", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_ars_and_a_scripts_own_class_are_refused():
    with pytest.raises(ConfigError, match=r"--encoder user_encoders:Tanh: ars searches the weights of its own linear "
                                          r"or mlp policy \(--policy\); your own encoder trains with ppo, a2c, trpo"):
        shoal.make_config("ars", "CartPole-v1", encoder="user_encoders:Tanh", **QUICK)

    class Mine(torch.nn.Module):  # inside a function: no process could import it by name
        pass

    with pytest.raises(ConfigError, match="put it in a module of its own"):
        shoal.PPOConfig(env="CartPole-v1", encoder=Mine)


def test_the_shoal_script_finds_encoder_and_wrapper_modules_in_the_working_directory_on_the_ray_backend(tmp_path):
    """As a README user does: my_encoders.py and my_wrappers.py beside them, `shoal train ...
    --backend ray`; the Ray workers (runners, evaluator) import them too; `shoal eval` in that
    directory builds them again (its episodes cut at the wrapper's 9 steps)."""
    (tmp_path / "my_encoders.py").write_text(Path(user_encoders.__file__).read_text())
    (tmp_path / "my_wrappers.py").write_text((Path(user_encoders.__file__).parent / "user_wrappers.py").read_text())
    script = str(Path(sys.executable).parent / "shoal")
    done = subprocess.run([script, "train", "ppo", "--env", "CartPole-v1", "--backend", "ray", "--num-env-runners",
                           "2", "--encoder", "my_encoders:Tanh", "--env-wrapper", "my_wrappers:time_limit", "steps=9",
                           "--total-steps", "512", "--num-envs-per-runner", "4", "--rollout-steps", "16",
                           "--minibatch-size", "64", "--eval-episodes", "2", "--no-progress", "--run-dir", "run"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lengths = [float(row["episode/length_mean"]) for row in csv.DictReader(open(tmp_path / "run" / "progress.csv"))
               if row["episode/length_mean"]]
    assert lengths and max(lengths) <= 9, lengths  # the runners' envs, in their Ray workers, are wrapped
    done = subprocess.run([script, "eval", "run", "--episodes", "3"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "CartPole-v1: return" in done.stdout, done.stderr
    assert float(re.search(r"return ([-\d.]+)", done.stdout)[1]) <= 9, done.stdout
