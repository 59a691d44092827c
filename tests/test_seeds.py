"""``shoal.train_seeds`` and ``shoal.resume_seeds``: the Python side of ``shoal train --seeds`` and
``shoal train --resume DIR``."""

from __future__ import annotations

import csv
import shutil
import signal
import statistics
import subprocess
import sys
import time

import pytest

import shoal
from shoal import checkpoint as ckpt

QUICK = {"progress": False, "tensorboard": False, "num_envs_per_runner": 4, "rollout_steps": 16,
         "minibatch_size": 32, "num_epochs": 1, "eval_episodes": 2}


def test_train_seeds_returns_each_runs_summary_and_their_mean_and_resume_seeds_goes_on(tmp_path):
    config = shoal.make_config("ppo", "CartPole-v1", total_steps=128, **QUICK)
    result = shoal.train_seeds(config, [4, 2], run_dir=tmp_path / "seeds")
    finals = [run["eval_return_mean"] for run in result["runs"]]
    assert result["seeds"] == [4, 2] and [run["run_dir"] for run in result["runs"]] == [
        str(tmp_path / "seeds" / "seed_4"), str(tmp_path / "seeds" / "seed_2")]
    assert result["eval_return_mean"] == pytest.approx(statistics.fmean(finals))
    assert result["eval_return_std"] == pytest.approx(statistics.pstdev(finals))
    assert (tmp_path / "seeds" / "curves.png").is_file() and result["plot"] == str(tmp_path / "seeds" / "curves.png")
    again = shoal.resume_seeds(tmp_path / "seeds")  # nothing left: the summaries they ended with
    assert [run["eval_return_mean"] for run in again["runs"]] == finals
    assert all(run["ended_before"] for run in again["runs"])
    more = shoal.resume_seeds(tmp_path / "seeds", config=shoal.make_config("ppo", "CartPole-v1", total_steps=256,
                                                                          **QUICK))
    assert [run["env_steps"] for run in more["runs"]] == [256, 256]
    with pytest.raises(shoal.ShoalError, match="--seeds takes different seeds"):
        shoal.train_seeds(config, [1, 1], run_dir=tmp_path / "other")
    with pytest.raises(shoal.ShoalError, match="--n-jobs must be at least 1"):
        shoal.train_seeds(config, [1], run_dir=tmp_path / "other", n_jobs=0)
    assert not (tmp_path / "other").exists()


def sigterm_once_started(tmp_path, args: list[str], started: list) -> tuple[int, str]:
    """`shoal ARGS` run, sent SIGTERM (to it alone, as a scheduler or `timeout` sends it) once every
    path in ``started`` exists; its exit code and stderr (a file: the seeds' processes share it,
    and a pipe would wait for them all to end)."""
    p = subprocess.Popen([sys.executable, "-m", "shoal", *args], stdout=subprocess.DEVNULL,
                         stderr=(tmp_path / "err").open("w"))
    deadline = time.time() + 120
    while not all(path.exists() for path in started) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("the command hung after SIGTERM") from None
    return p.returncode, (tmp_path / "err").read_text()


def test_sigterm_to_the_command_alone_ends_every_running_seed_saved(tmp_path):
    """A scheduler's or `timeout`'s stop reaches the `shoal` process only: it passes it on to the
    seeds' processes, each of which checkpoints where it is and ends, instead of training on
    orphaned (which, were it to fail, end within a minute: 200k steps)."""
    runs = tmp_path / "seeds"
    code, err = sigterm_once_started(tmp_path, ["train", "ppo", "--env", "CartPole-v1", "--seeds", "0", "1", "2",
                                                "--n-jobs", "2", "--total-steps", "200000", "--no-progress",
                                                "--no-tensorboard", "--run-dir", str(runs)],
                                     [runs / f"seed_{s}" / "progress.csv" for s in (0, 1)])
    assert code == 130 and f"shoal train --resume {runs}" in err and "Traceback" not in err, err
    sizes = {}
    for seed in (0, 1):  # each saved where it had come to
        with open(runs / f"seed_{seed}" / "progress.csv") as f:
            last = int(list(csv.DictReader(f))[-1]["env_steps"])
        assert ckpt.read_meta(ckpt.resolve(runs / f"seed_{seed}"))["env_steps"] == last and 0 < last < 200000
        sizes[seed] = (runs / f"seed_{seed}" / "progress.csv").stat().st_size
    assert not (runs / "seed_2").exists()  # the third never began
    time.sleep(2)  # and no process trains on
    assert {s: (runs / f"seed_{s}" / "progress.csv").stat().st_size for s in (0, 1)} == sizes


def test_sigterm_while_one_seeds_process_is_idle_ends_the_running_seed_saved(tmp_path):
    """A worker whose run has ended sits idle in the pool while another seed trains: SIGTERM passed
    on to it must not break the pool (which would leave the running seed unsaved and the command
    hanging). Seed 0 has nothing left to train (--stop-return below its return), seed 1 never
    began."""
    runs = tmp_path / "seeds"
    shoal.train_seeds(shoal.make_config("ppo", "CartPole-v1", total_steps=512, **QUICK), [0, 1], run_dir=runs)
    shutil.rmtree(runs / "seed_1")
    code, err = sigterm_once_started(tmp_path, ["train", "--resume", str(runs), "--total-steps", "200000",
                                                "--stop-return", "-1000", "--eval-interval", "1000000", "--n-jobs",
                                                "2"], [runs / "seed_1" / "progress.csv"])
    assert code == 130 and f"shoal train --resume {runs}" in err and "Traceback" not in err, err
    assert "(it had ended before: nothing left to train)" in err  # seed 0's process was idle
    assert 0 < ckpt.read_meta(ckpt.resolve(runs / "seed_1"))["env_steps"] < 200000


def test_the_iqm_of_runs_and_its_bootstrap_interval_over_them():
    """rliable's interquartile mean: a quarter of the runs (rounded down) cut from each end; its
    interval the 2.5th and 97.5th percentiles of the IQMs of resampled runs, which for 5 runs
    (3,125 equally likely resamples) can be enumerated exactly."""
    import itertools

    import numpy as np

    from shoal.seeds import iqm, iqm_interval

    scores = [174.5, 140.3, 410.1, 202.9, 211.3]
    assert iqm(scores) == pytest.approx((174.5 + 202.9 + 211.3) / 3)
    assert iqm([1.0, 2.0, 3.0, 100.0]) == 2.5 and iqm([1.0, 2.0, 9.0]) == 4.0 and iqm([7.0]) == 7.0
    middle, low, high = iqm_interval(scores)
    assert middle == iqm(scores) and iqm_interval(scores) == (middle, low, high)  # seeded: the same each time
    exact = np.array([iqm(pick) for pick in itertools.product(scores, repeat=5)])
    # each bound a 2.5% point of the exact distribution (which has atoms: a bound may sit on one)
    assert (exact < low).mean() <= 0.03 and (exact <= low).mean() >= 0.02, low
    assert (exact > high).mean() <= 0.03 and (exact >= high).mean() >= 0.02, high
    assert iqm_interval([3.0, 3.0, 3.0]) == (3.0, 3.0, 3.0)
