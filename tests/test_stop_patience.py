"""``--stop-patience N`` (stable-baselines3's StopTrainingOnNoModelImprovement): a run stops once N
evaluations in a row have not beaten its best; a resume counts the run's evaluations so far."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

import shoal
from shoal import checkpoint as ckpt
from shoal.cli import main

FAST = ["--no-progress", "--no-tensorboard", "--num-envs-per-runner", "4", "--rollout-steps", "32",
        "--minibatch-size", "64", "--eval-episodes", "2", "--eval-interval", "128", "--total-steps", "100000"]


def returns(run):
    with open(run / "eval.csv") as f:
        return [float(row["eval/return_mean"]) for row in csv.DictReader(f)]


def stale_runs(values):
    """After each evaluation, how many in a row had not beaten the best before them."""
    best, stale, out = float("-inf"), 0, []
    for v in values:
        best, stale = (v, 0) if v > best else (best, stale + 1)
        out.append(stale)
    return out


def test_a_run_stops_at_the_first_evaluation_that_makes_n_in_a_row_no_better(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "ppo", "--stop-patience", "2", "--run-dir", str(run), *FAST]) == 0
    err = capsys.readouterr().err
    assert "stopped at --stop-patience (the last 2 evaluations were no better)" in err, err
    stale = stale_runs(returns(run))
    assert stale[-1] == 2 and max(stale[:-1]) < 2  # not before, and not after
    summary_best = max(returns(run))
    with shoal.load(run / "checkpoints" / "best") as best:  # the best evaluation's policy is kept
        assert best.env_steps == 128 * (returns(run).index(summary_best) + 1)
    # `shoal eval --best` (rl-zoo's --load-best) and `shoal export --best` take that one, not the newest
    capsys.readouterr()
    assert main(["eval", str(run), "--best", "--episodes", "1"]) == 0
    assert f"checkpoint {run / 'checkpoints' / 'best'}, policy version " in capsys.readouterr().out
    assert main(["export", str(run), "--best", "--out", str(tmp_path / "best.onnx")]) == 0
    assert (tmp_path / "best.onnx").stat().st_size > 0
    best_version = ckpt.read_meta(run / "checkpoints" / "best")["policy_version"]
    assert best_version != ckpt.read_meta(ckpt.resolve(run))["policy_version"]
    server = subprocess.Popen([sys.executable, "-m", "shoal", "serve-policy", str(run), "--best", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:  # serve-policy --best serves that one too
        line = server.stdout.readline()
        assert line.startswith(f"serving default (version {best_version}) on "), line
        address = line.split(" on ")[1].split()[0]
        assert server.stdout.readline() == (f"  clients: shoal.PolicyClient('{address}').act(obs) in Python, or "
                                            "proto/shoal.proto's PolicyService in any language "
                                            "(examples/node_simulator/play.js)\n")
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert main(["serve-policy", str(run), "--best", "--follow"]) == 2
    assert "--best serves each run's best checkpoint as it is now" in capsys.readouterr().err
    for path, message in ((run / "checkpoints" / "best", "--best takes a run directory"),
                          (tmp_path / "nowhere", "does not exist")):
        assert main(["eval", str(path), "--best"]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    # a resume with the same patience has nothing to do; with more, it trains on and counts those two
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    assert "already had 2 evaluations in a row no better than its best" in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "--stop-patience", "3", "--no-progress"]) == 0
    stale = stale_runs(returns(run))
    assert stale[-1] == 3 and max(stale[:-1]) < 3


def test_patience_must_be_a_whole_evaluation():
    with pytest.raises(shoal.ConfigError, match="stop_patience must be at least 1 evaluation"):
        shoal.make_config("ppo", stop_patience=0)
