"""``--init-from RUN_DIR_OR_CHECKPOINT`` (rl-zoo's --trained-agent, SB3's load then learn): a new
run whose networks start from another run's checkpoint, with its own settings, and fresh
optimisers, counters and replay."""

from __future__ import annotations

import csv

import pytest
import torch
import yaml

import shoal
from shoal.cli import main

QUICK = {"progress": False, "tensorboard": False, "eval_interval": 0, "eval_episodes": 3}
OFF = {"learning_starts": 64, "batch_size": 32, "hidden_sizes": (32, 32)}


def trained(tmp_path, algo, env, steps, **settings):
    """A finished run's directory."""
    run = tmp_path / f"{algo}-source"
    shoal.train(shoal.make_config(algo, env, total_steps=steps, **QUICK, **settings), run_dir=run)
    return run


def state_of(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


@pytest.mark.parametrize("algo, env, settings, networks", [
    ("ppo", "CartPole-v1", {}, ()),
    ("dqn", "CartPole-v1", OFF, ("target",)),
    ("sac", "Pendulum-v1", OFF, ("critics", "target_critics")),
    ("td3", "Pendulum-v1", OFF, ("critics", "target_critics", "target_actor")),
    ("crossq", "Pendulum-v1", {**OFF, "critic_hidden_sizes": (32, 32)}, ("critics",)),
    ("tqc", "Pendulum-v1", {**OFF, "n_quantiles": 5}, ("critics", "target_critics")),
    ("qrdqn", "CartPole-v1", {**OFF, "n_quantiles": 5}, ("target",)),
    ("ars", "CartPole-v1", {"zero_policy": False}, ()),
])
def test_a_new_run_starts_from_the_checkpoints_networks_with_fresh_optimisers_and_counters(tmp_path, monkeypatch, algo,
                                                                                            env, settings, networks):
    source = trained(tmp_path, algo, env, 512, **settings)
    with shoal.load(source) as before:
        old = before.learner.obj
        policy, others = state_of(old.policy), {n: state_of(getattr(old, n)) for n in networks}
        alpha = old.log_alpha.item() if algo in ("sac", "crossq", "tqc") else None
        returns = before.evaluate()["eval/return_mean"]
    config = shoal.make_config(algo, env, init_from=str(source), lr=1e-4, total_steps=10_000, **QUICK, **settings)
    if not networks:  # all in the policy: read from policy.pt, with no pickled code (state.pt is pickled)
        monkeypatch.setattr(shoal.checkpoint, "read_state", lambda path: pytest.fail("state.pt was read"))
    with shoal.make(config) as algo_:
        learner = algo_.learner.obj
        assert same(state_of(learner.policy), policy)
        for name in networks:  # the critics and targets learned with that policy
            assert same(state_of(getattr(learner, name)), others[name]), name
        if alpha is not None:
            assert learner.log_alpha.item() == alpha and alpha != 0.0  # the temperature tuned with them
        optimizers = [o for o in vars(learner).values() if isinstance(o, torch.optim.Optimizer)]
        assert (optimizers or algo == "ars") and all(not o.state for o in optimizers)  # fresh: no moments
        assert all(g["lr"] == 1e-4 for o in optimizers for g in o.param_groups if "lr" in g)
        assert algo_.env_steps == 0 and algo_.policy_version == 1 and learner.version == 1
        if networks:
            assert len(learner.replay) == 0
        # runners and evaluators act with the loaded policy (the next version): the same evaluation
        assert algo_.evaluate()["eval/return_mean"] == returns
        algo_.train()
        assert algo_.policy_version >= 1


def test_fine_tuning_a_solved_policy_goes_on_from_its_return_and_resumes_without_its_source(tmp_path, capsys):
    source = tmp_path / "source"
    assert main(["train", "ppo", "--total-steps", "100000", "--stop-return", "475", "--run-dir", str(source),
                 "--no-progress", "--no-tensorboard"]) == 0
    with open(source / "eval.csv") as f:
        solved = float(list(csv.DictReader(f))[-1]["eval/return_mean"])
    assert solved >= 475
    tuned = tmp_path / "tuned"
    assert main(["train", "ppo", "--init-from", str(source), "--lr", "1e-4", "--total-steps", "1024",
                 "--eval-interval", "1024", "--run-dir", str(tuned), "--no-progress", "--no-tensorboard"]) == 0
    with open(tuned / "eval.csv") as f:
        first = float(list(csv.DictReader(f))[0]["eval/return_mean"])
    assert first >= 0.8 * solved  # a random policy's CartPole return is ~20
    assert yaml.safe_load((tuned / "config.yaml").read_text())["init_from"] == str(source)
    for path in source.rglob("*"):  # the source's checkpoints are gone: a resume restores the run's own
        if path.is_file():
            path.unlink()
    assert main(["train", "--resume", str(tuned), "--total-steps", "2048", "--no-progress"]) == 0


@pytest.mark.parametrize("argv, message", [
    (["sac", "--env", "Pendulum-v1"], "is a checkpoint of ppo, not sac: start from it with `shoal train ppo"),
    (["ppo", "--hidden-sizes", "32"], "holds a network these settings do not build"),
    (["ppo", "--env", "Acrobot-v1"], "does not fit Acrobot-v1"),
])
def test_a_checkpoint_these_settings_cannot_start_from_is_refused_in_one_line_and_leaves_no_run(tmp_path, capsys,
                                                                                                 argv, message):
    source = trained(tmp_path, "ppo", "CartPole-v1", 256)
    run = tmp_path / "run"
    assert main(["train", *argv, "--init-from", str(source), "--run-dir", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not run.exists()


def test_a_missing_checkpoint_is_named(tmp_path, capsys):
    assert main(["train", "ppo", "--init-from", str(tmp_path / "nowhere"), "--run-dir", str(tmp_path / "run"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"shoal: error: --init-from: {tmp_path / 'nowhere'} does not exist: give a run directory "
                           "or a checkpoint directory"), err
    assert not (tmp_path / "run").exists()
