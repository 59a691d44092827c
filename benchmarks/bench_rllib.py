"""Time to a training return of 450 on CartPole-v1: shoal PPO vs RLlib PPO, both on Ray with 2 env runners.

Each framework runs PPO with its own tuned CartPole settings, as a user of it would: shoal its
shipped preset (rl-baselines3-zoo's: 8 envs per runner, 32 steps, 20 epochs of batches of 256,
64x64 tanh networks), RLlib the settings of its own tuned example `tuned_examples/ppo/
cartpole_ppo.py` (4,000-step batches, 6 epochs of minibatches of 128, lr 3e-4, a shared 32-unit
linear layer, vf_loss_coeff 0.01, the KL loss). Both run on a fresh local Ray cluster with 2 env
runner actors and a learner in the driver process.

The measure is the same on both sides: the mean return of the last 100 training episodes
(shoal's `episode/return_mean`, RLlib's `env_runners/episode_return_mean`, each over 100
episodes), checked after every training iteration. Wall time runs from before `ray.init` to the
end of the first iteration whose mean reaches 450, so cluster start-up, actor creation, sampling,
learning and weight sync are all in it. No evaluation episodes are played on either side.

RLlib pins gymnasium 1.2.2, so it lives in a virtual environment of its own (`make bench-rllib`
creates `.venv-rllib` with `ray[rllib]` at shoal's Ray version and the same torch); this script
calls that environment's Python for RLlib's runs, each seed in a fresh process per framework.

    .venv/bin/python benchmarks/bench_rllib.py [--seeds 0 1 2] [--rllib-python .venv-rllib/bin/python]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import isolated, machine, median, save

TARGET, BUDGET, RUNNERS = 450.0, 300_000, 2
ROOT = Path(__file__).resolve().parent.parent


def run_shoal(seed: int) -> dict:
    """shoal PPO with its CartPole-v1 preset on the ray backend; time to the target."""
    import shoal

    start = time.perf_counter()
    config = shoal.make_config("ppo", "CartPole-v1", seed=seed, backend="ray", num_env_runners=RUNNERS,
                               progress=False, tensorboard=False)
    curve = []
    with shoal.make(config) as algo:
        while algo.env_steps < BUDGET:
            ret = algo.train().get("episode/return_mean", float("nan"))
            curve.append((algo.env_steps, time.perf_counter() - start, ret))
            if ret >= TARGET:
                break
    return finish(curve)


def run_rllib(seed: int) -> dict:
    """RLlib PPO with its tuned CartPole-v1 example's settings; time to the target."""
    start = time.perf_counter()
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    ray.init(address="local", include_dashboard=False)  # a new cluster, as shoal starts (never one found on disk)
    config = (PPOConfig()
              .environment("CartPole-v1")
              .env_runners(num_env_runners=RUNNERS)
              .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear",
                                                         vf_share_layers=True))
              .training(gamma=0.99, lr=3e-4, num_epochs=6, vf_loss_coeff=0.01, use_kl_loss=True)
              .debugging(seed=seed))
    algo = config.build_algo()
    curve = []
    try:
        steps = 0
        while steps < BUDGET:
            result = algo.train()
            steps = int(result["num_env_steps_sampled_lifetime"])
            ret = float(result["env_runners"].get("episode_return_mean", float("nan")))
            curve.append((steps, time.perf_counter() - start, ret))
            if ret >= TARGET:
                break
    finally:
        algo.stop()
        ray.shutdown()
    return finish(curve)


def finish(curve: list[tuple[int, float, float]]) -> dict:
    """The first point of the curve at the target (NaN seconds if none), with the curve."""
    hit = next((p for p in curve if p[2] >= TARGET), None)
    steps, seconds = (hit[0], hit[1]) if hit else (curve[-1][0] if curve else 0, float("nan"))
    return {"seconds": seconds, "steps": steps, "iterations": len(curve), "curve": curve}


def rllib_in_its_venv(python: str, seed: int) -> dict:
    """Run :func:`run_rllib` with RLlib's own interpreter; its result comes back as JSON."""
    code = f"import json, bench_rllib; print('RESULT ' + json.dumps(bench_rllib.run_rllib({seed})))"
    out = subprocess.run([python, "-c", code], cwd=Path(__file__).parent, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        sys.exit(f"RLlib's run failed (seed {seed}, exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rllib-python", default=str(ROOT / ".venv-rllib" / "bin" / "python"),
                        help="the Python of a virtual environment with ray[rllib] (make bench-rllib makes one)")
    args = parser.parse_args()
    if not Path(args.rllib_python).exists():
        sys.exit(f"no RLlib environment at {args.rllib_python}: run `make bench-rllib`, or pass --rllib-python")
    version = subprocess.run([args.rllib_python, "-c", "import ray; print(ray.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    print(f"machine: {machine()}; RLlib {version}; target: training return mean (100 episodes) >= {TARGET:g}")
    rows = []
    for seed in args.seeds:
        s = isolated(run_shoal, seed)
        r = rllib_in_its_venv(args.rllib_python, seed)
        rows.append({"seed": seed, "shoal": s, "rllib": r})
        print(f"seed {seed}: shoal {s['seconds']:.1f} s ({s['steps']:,} steps, {s['iterations']} iterations)  "
              f"RLlib {r['seconds']:.1f} s ({r['steps']:,} steps, {r['iterations']} iterations)  "
              f"ratio {s['seconds'] / r['seconds']:.2f}", flush=True)
    shoal_s, rllib_s = median([x["shoal"]["seconds"] for x in rows]), median([x["rllib"]["seconds"] for x in rows])
    print(f"median time to {TARGET:g}: shoal {shoal_s:.1f} s, RLlib {rllib_s:.1f} s, shoal / RLlib = {shoal_s / rllib_s:.2f}")
    path = save("rllib", {"target": TARGET, "runners": RUNNERS, "rllib_version": version, "runs": rows,
                          "median_shoal_s": shoal_s, "median_rllib_s": rllib_s})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
