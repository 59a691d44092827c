"""Round trips and determinism: same seed -> same parameters; save -> load -> same state;
a resumed run ends where an uninterrupted one does; checkpoint writes are atomic."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import shoal
from shoal import checkpoint as ckpt
from shoal.errors import ShoalError


def train_iterations(config, n):
    with shoal.make(config) as algo:
        for _ in range(n):
            algo.train()
        return algo.backend.get(algo.learner.call("get_state"))


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_same_seed_same_parameters_and_other_seed_differs(tiny):
    a = train_iterations(tiny(seed=3, num_env_runners=2, normalize_obs=True), 4)
    b = train_iterations(tiny(seed=3, num_env_runners=2, normalize_obs=True), 4)
    c = train_iterations(tiny(seed=4, num_env_runners=2, normalize_obs=True), 4)
    assert_same_weights(a["weights"], b["weights"])
    assert not np.array_equal(a["weights"]["actor.0.weight"], c["weights"]["actor.0.weight"])


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1", "CartPoleNoVel-v1", "MountainCarContinuous-v0"])
def test_save_load_continues_exactly(tiny, tmp_path, env):
    # normalize_rewards: the runners' discounted returns, mid-episode, and the learner's statistics;
    # an LSTM: each runner's memory, mid-episode; gSDE: the runners' noise matrices, drawn from their
    # saved generators at each rollout's start and every sde_sample_freq steps
    config = tiny(env=env, normalize_obs=True, lr_schedule="linear", normalize_rewards=env == "Pendulum-v1",
                  lstm_size=8 if env == "CartPoleNoVel-v1" else 0, use_sde=env == "MountainCarContinuous-v0",
                  sde_sample_freq=5)
    uninterrupted = train_iterations(config, 6)
    with shoal.make(config) as algo:
        for _ in range(3):
            algo.train()
        saved = algo.backend.get(algo.learner.call("get_state"))
        algo.save(tmp_path / "ck")
    with shoal.load(tmp_path / "ck") as algo:
        restored = algo.backend.get(algo.learner.call("get_state"))
        assert_same_weights(saved["weights"], restored["weights"])
        assert restored["version"] == saved["version"] == 3 and algo.iteration == 3
        assert algo.env_steps == 3 * config.batch_size
        for _ in range(3):
            algo.train()
        resumed = algo.backend.get(algo.learner.call("get_state"))
    assert_same_weights(uninterrupted["weights"], resumed["weights"])
    if config.normalize_rewards:
        assert uninterrupted["return_norm"]["var"] == resumed["return_norm"]["var"]
    for group_a, group_b in zip(uninterrupted["extra"]["state"].values(), resumed["extra"]["state"].values()):
        torch.testing.assert_close(group_a["exp_avg_sq"], group_b["exp_avg_sq"], rtol=0, atol=0)


def test_load_policy_reads_no_pickled_code_and_acts_like_the_trained_policy(tiny, tmp_path):
    with shoal.make(tiny()) as algo:
        algo.train()
        algo.save(tmp_path / "ck")
        live = algo.get_policy()
    policy = shoal.load_policy(tmp_path / "ck")  # torch.load(weights_only=True) inside
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    np.testing.assert_array_equal(policy.act(obs), live.act(obs))
    assert policy.version == 1


def test_failed_write_leaves_no_checkpoint_and_the_previous_one_is_used(tiny, tmp_path, monkeypatch):
    run = tmp_path / "run"
    with shoal.make(tiny()) as algo:
        algo.train()
        algo.save(run / "checkpoints" / "ckpt_000000001")
        algo.train()
        real_save = torch.save

        def dying_save(obj, f, *a, **k):  # the process "dies" after writing the first file
            if str(f).endswith(ckpt.STATE_FILE):
                raise OSError("disk full")
            return real_save(obj, f, *a, **k)

        monkeypatch.setattr(torch, "save", dying_save)
        with pytest.raises(ShoalError, match=r"cannot write a checkpoint at .*ckpt_000000002: disk full$"):
            algo.save(run / "checkpoints" / "ckpt_000000002")
    assert not (run / "checkpoints" / "ckpt_000000002").exists()
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["ckpt_000000001"]  # no temporary left either
    assert ckpt.resolve(run).name == "ckpt_000000001"


def test_save_replaces_a_checkpoint_and_nothing_else(tiny, tmp_path):
    """``algo.save(path)`` writes a directory of its own: over a user's file or a directory of
    other things (``algo.save(".")``) it would have deleted them."""
    import numpy as np

    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "train.py").write_text("mine too")
    with shoal.make(tiny()) as algo:
        algo.train()
        for path, what in ((tmp_path / "notes.txt", "a file"), (tmp_path / "project", "a directory that holds")):
            with pytest.raises(ShoalError, match=f"cannot write a checkpoint at {path}: it is {what}"):
                algo.save(path)
        with pytest.raises(ShoalError, match=r"notes.txt/ckpt: File exists \(.*notes.txt\)$"):
            algo.save(tmp_path / "notes.txt" / "ckpt")
        first = algo.save(tmp_path / "ckpt")
        algo.train()
        assert algo.save(tmp_path / "ckpt") == first  # a checkpoint is replaced by the newer one
        (tmp_path / "empty").mkdir()
        algo.save(tmp_path / "empty")
        for bad in (0, -1, 2.5, "3", True):
            with pytest.raises(ShoalError, match="episodes must be a whole number of at least 1"):
                algo.evaluate(episodes=bad)
        assert algo.evaluate(episodes=np.int64(3))["eval/episodes"] == 3
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "project" / "train.py").exists()
    assert ckpt.read_meta(tmp_path / "ckpt")["iteration"] == 2 and ckpt.is_checkpoint(tmp_path / "empty")


def test_checkpoint_of_another_algorithm_is_refused(tiny, tmp_path):
    with shoal.make(tiny()) as algo:
        algo.train()
        path = algo.save(tmp_path / "ck")
        meta = json.loads((path / "meta.json").read_text())
        (path / "meta.json").write_text(json.dumps({**meta, "algo": "dqn"}))
        with pytest.raises(ShoalError, match="from algorithm 'dqn', not 'ppo'"):
            algo.restore(path)


@pytest.mark.parametrize("name, opens, error", [("meta.json", "read_meta", "JSONDecodeError"),
                                                 ("policy.pt", "load_policy", "RuntimeError: PytorchStreamReader "
                                                  "failed reading zip archive: failed finding central directory)"),
                                                 ("state.pt", "load", "RuntimeError: PytorchStreamReader")])
def test_a_checkpoint_file_cut_short_since_is_named_in_one_line(tiny, tmp_path, name, opens, error):
    """Checkpoints are written whole; a copy cut short (scp, a full disk) is named, with what to do,
    instead of json's or torch's traceback. The policy server's follower catches ShoalErrors."""
    with shoal.make(tiny()) as algo:
        algo.train()
        path = algo.save(tmp_path / "ck")
    whole = (path / name).read_bytes()
    (path / name).write_bytes(whole[: min(200, len(whole) // 2)])
    read = {"read_meta": ckpt.read_meta, "load_policy": shoal.load_policy, "load": shoal.load}[opens]
    with pytest.raises(ShoalError) as raised:
        read(path)
    assert str(raised.value).startswith(f"checkpoint {path}: {name} cannot be read ({error}")
    assert str(raised.value).endswith("it was damaged after it was written, or is not shoal's: delete that "
                                      "checkpoint directory to use the one before it")


@pytest.mark.parametrize("use", ["train", "evaluate", "get_policy", "save"])
def test_an_algorithm_used_after_stop_says_so(tiny, tmp_path, use):
    """In-process its objects would still answer, where on Ray its actors are gone: the same code
    must fail the same way on both, and say what to do instead."""
    with shoal.make(tiny()) as algo:
        algo.train()
        algo.save(tmp_path / "ck")
    with pytest.raises(ShoalError, match=r"^this Algorithm was stopped .*: shoal.load\(CHECKPOINT\) makes a new one"):
        getattr(algo, use)(*([tmp_path / "ck2"] if use == "save" else []))
    with shoal.load(tmp_path / "ck") as again:  # what the message says to do
        assert again.train()["env_steps"] > algo.env_steps


# pytest-xdist workers ignore SIGINT and children inherit that (a user's shell does not), so the
# child restores Python's handler first. Not with preexec_fn: Python code in the forked child of a
# worker that has run gRPC servers can abort in grpc's fork handlers before exec (seen: a child
# killed by SIGABRT with "epoll_wait error: Bad file descriptor", and no run).
_SHOAL = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
          "runpy.run_module('shoal.cli', run_name='__main__', alter_sys=True)")


def _shoal(*args, **kw):
    return subprocess.Popen([sys.executable, "-c", _SHOAL, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_killed_run_resumes_to_the_same_parameters(tmp_path):
    args = ["train", "ppo", "--env", "CartPole-v1", "--total-steps", "6144", "--checkpoint-interval", "2048",
            "--eval-interval", "4096", "--no-progress", "--no-tensorboard", "--seed", "5"]
    full = _shoal(*args, "--run-dir", str(tmp_path / "full"))
    killed = _shoal(*args, "--run-dir", str(tmp_path / "killed"))
    deadline = time.time() + 120
    while not ckpt.checkpoints_in(tmp_path / "killed") and time.time() < deadline:
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)  # no chance to clean up: only atomic writes survive
    killed.wait()
    assert full.wait(timeout=300) == 0, full.stderr.read()
    assert ckpt.checkpoints_in(tmp_path / "killed"), "the run never wrote a checkpoint"
    resumed = _shoal("train", "--resume", str(tmp_path / "killed"), "--no-progress")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    a = ckpt.read_policy(ckpt.resolve(tmp_path / "full"))["weights"]
    b = ckpt.read_policy(ckpt.resolve(tmp_path / "killed"))["weights"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    rows = lambda p: (p / "progress.csv").read_text().splitlines()  # noqa: E731
    assert len(rows(tmp_path / "full")) == len(rows(tmp_path / "killed"))  # no duplicated iterations


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])  # Ctrl-C; a scheduler's or timeout's stop
def test_ctrl_c_or_sigterm_writes_a_checkpoint_and_the_run_resumes(sig, tmp_path):
    run = tmp_path / "run"
    p = _shoal("train", "ppo", "--env", "CartPole-v1", "--total-steps", "200000", "--no-progress",
               "--no-tensorboard", "--run-dir", str(run))
    deadline = time.time() + 120
    while not (run / "progress.csv").exists() and time.time() < deadline:
        time.sleep(0.05)
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "continue with: shoal train --resume" in err and "Traceback" not in err
    steps = ckpt.read_meta(ckpt.resolve(run))["env_steps"]
    assert steps > 0
    resumed = _shoal("train", "--resume", str(run), "--total-steps", str(steps + 512), "--no-progress")
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    assert ckpt.read_meta(ckpt.resolve(run))["env_steps"] == steps + 512
    # (a resume to the steps it has already reached is refused: tests/test_cli.py)


def test_a_runs_checkpoints_directory_resolves_as_its_run_does(tiny, tmp_path):
    """`shoal eval RUN/checkpoints` (a path completed one level too far) is the run's newest
    checkpoint, not "no complete checkpoint"; so is a run directory named checkpoints."""
    run = tmp_path / "checkpoints"
    shoal.train(tiny(total_steps=128, checkpoint_interval=64), run_dir=run)
    newest = ckpt.checkpoints_in(run)[-1]
    assert ckpt.resolve(run / "checkpoints") == ckpt.resolve(run) == newest
    assert ckpt.resolve(run / "checkpoints" / "best").name == "best"


def test_a_run_directory_without_a_checkpoint_yet_says_when_one_comes(tmp_path):
    """`shoal eval` or `serve-policy --follow` started just after `shoal train`: not a bare "no
    checkpoint", but when the run writes one."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("algo: ppo\ncheckpoint_interval: 25000\n")
    with pytest.raises(ShoalError, match=r"no complete checkpoint in .*run yet \(looked in .*\): its run writes one "
                                         r"every 25,000 env steps, its best at the first evaluation"):
        ckpt.resolve(run)
    (tmp_path / "other").mkdir()  # not a run directory: no promise of a checkpoint to come
    with pytest.raises(ShoalError, match=r"no complete checkpoint in .*other \(looked in .*checkpoints\)$"):
        ckpt.resolve(tmp_path / "other")


def test_serve_policy_follow_waits_for_a_local_runs_first_checkpoint(tiny, tmp_path):
    """`shoal train` in one terminal, `shoal serve-policy RUN --follow` in another at once: the
    server says it waits for the run's first checkpoint, then serves it."""
    import shutil

    from shoal.remote.policyserver import PolicyClient

    done = tmp_path / "done"
    shoal.train(tiny(total_steps=128), run_dir=done)
    run = tmp_path / "run"  # a run that has written its config and nothing else yet
    run.mkdir()
    shutil.copy(done / "config.yaml", run / "config.yaml")
    server = _shoal("serve-policy", str(run), "--follow", "--port", "0")
    client = None
    try:
        first = server.stdout.readline()
        assert first.startswith(f"waiting for the first checkpoint of {run}: its run writes one every "), first
        time.sleep(1.5)  # still waiting, and still up
        assert server.poll() is None
        shutil.copytree(done / "checkpoints", run / "checkpoints.tmp")
        (run / "checkpoints.tmp").rename(run / "checkpoints")  # the checkpoint appears whole, as the run writes it
        line = server.stdout.readline()
        assert line.startswith("serving default (version 2), following their runs on "), line
        client = PolicyClient(line.split(" on ")[1].split()[0])
        assert client.act(np.zeros((1, 4), np.float32))[1] == 2
    finally:
        if client is not None:
            client.close()
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize("how", ["sigterm", "ray's handler"])
def test_a_stop_signal_while_the_roles_start_stops_the_command_and_leaves_no_run_directory(tiny, tmp_path,
                                                                                           monkeypatch, capsys, how):
    """SIGTERM while the roles start (Ray starting, its actors being made) stops as Ctrl-C does:
    nothing was trained, so nothing is left to resume; a run being resumed is left as it was.
    While ray.init runs, Ray's own handler turns SIGTERM into sys.exit(15): the same."""
    import shoal.trainer
    from shoal.backends import _python_sigterm_kept
    from shoal.cli import main

    def starting(config):
        if how == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the signal's KeyboardInterrupt ends this at once
        with _python_sigterm_kept():  # as RayBackend's ray.init, in which Ray's handler exits
            raise SystemExit(signal.SIGTERM)

    monkeypatch.setattr(shoal.trainer, "make", starting)
    run, before = tmp_path / "run", signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        shoal.train(tiny(), run_dir=run)
    assert time.monotonic() - started < 10 and not run.exists()
    assert signal.getsignal(signal.SIGTERM) == before
    assert main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run), "--no-progress"]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "shoal: interrupted" and not run.exists()
    # resuming: the run's directory stays as it was, free for the next --resume
    monkeypatch.undo()
    shoal.train(tiny(total_steps=256), run_dir=run)
    before_files = sorted(p.relative_to(run) for p in run.rglob("*"))
    stopped = []

    class Restoring:  # the roles are up; restoring the checkpoint into them is cut short
        def __init__(self, config):
            pass

        def restore(self, path):
            starting(None)

        def stop(self):
            stopped.append(True)

    for made in (starting, Restoring):
        monkeypatch.setattr(shoal.trainer, "Algorithm", made)
        assert main(["train", "--resume", str(run), "--total-steps", "1024"]) == 130
        assert capsys.readouterr().err.splitlines()[-1] == "shoal: interrupted"
        assert sorted(p.relative_to(run) for p in run.rglob("*")) == before_files
    assert stopped == [True]  # the roles that had started were stopped
    monkeypatch.undo()
    assert shoal.resume(run, tiny(total_steps=512))["env_steps"] >= 512


@pytest.mark.parametrize("signals", [1, 2])
def test_a_stop_signal_ends_the_run_after_its_iteration_and_a_second_one_at_once(tiny, tmp_path, signals):
    """Ctrl-C and SIGTERM ask the loop to stop: the iteration under way ends whole, then the run is
    saved there (an exception raised at any point could leave a lock another thread waits on held,
    as one left TensorBoard's writer hanging). A second one stops it where it is, saved too."""
    reached = []

    def signalled(algo, metrics):
        if algo.iteration == 3:
            for _ in range(signals):
                os.kill(os.getpid(), signal.SIGTERM)
            reached.append(algo.env_steps)  # the rest of the iteration (here, the callback) after the signal
        return True

    run, before = tmp_path / "run", signal.getsignal(signal.SIGTERM)
    with pytest.raises(shoal.ShoalError, match="interrupted at"):
        shoal.train(tiny(total_steps=100_000), run_dir=run, callback=signalled)
    meta = ckpt.read_meta(ckpt.resolve(run))
    assert meta["iteration"] == 3
    assert reached == ([meta["env_steps"]] if signals == 1 else [])
    assert signal.getsignal(signal.SIGTERM) == before  # the run's handler is gone with it
