"""Time to an evaluation of 475 on CartPole-v1: shoal PPO vs RLlib PPO, both on Ray with 2 env runners.

Both frameworks run on a fresh local Ray cluster with 2 env runner actors and the learner in
the driver, and are judged by the same evaluation, the one the stable-baselines3 comparisons
use: 10 deterministic episodes (the argmax action), one on each env of a 10-env vector env,
about every 4,000 env steps; a run stops at the first evaluation whose mean reaches 475. Wall
time runs from before the framework starts Ray (imports excluded) to the end of that
evaluation, so cluster start-up, actor creation, sampling, learning, weight sync and the
evaluations are all in it. shoal evaluates with its own evaluator (`--eval-interval 4096`, as
`shoal train` does, with its logging and best-checkpoint writes); RLlib's policy is played by
this script in the driver, from the module `Algorithm.get_module()` returns (the driver's env
runner, synced after every update), whenever 4,000 steps have passed since the last evaluation.

Three configurations per seed:
- shoal: its shipped CartPole-v1 preset (rl-baselines3-zoo's: 8 envs per runner, 32 steps,
  20 epochs of minibatches of 256, lr and clip range decaying linearly from 1e-3 and 0.2,
  gamma 0.98, GAE 0.8, 64x64 tanh networks), 2 runners.
- RLlib, tuned: the settings of RLlib's own tuned example `tuned_examples/ppo/cartpole_ppo.py`
  (4,000-step batches, 6 epochs of minibatches of 128, lr 3e-4, one shared 32-unit linear
  layer, vf_loss_coeff 0.01, the KL loss): RLlib as its users would run it.
- RLlib, shoal's settings: the preset above as far as RLlib's options reach (the same batches,
  epochs, networks, gamma, GAE, gradient clipping at 0.5 and the learning rate's linear decay;
  its clip range stays at 0.2, no KL loss, no value-loss clip): the same algorithm, so the
  difference is the framework.

The no-evaluation rule RLlib's examples stop on, `env_runners/episode_return_mean`, is not used:
in RLlib 2.60 it averages the episodes of recent iterations, not a fixed 100 (with 512-step
iterations it jumped from 184 to 500 in one iteration), so it cannot be matched on shoal's side.

RLlib pins gymnasium 1.2.2, so it lives in a virtual environment of its own (`make bench-rllib`
creates `.venv-rllib` with `ray[rllib]` at shoal's Ray version and the same torch); this script
calls that environment's Python for RLlib's runs, each seed in a fresh process per run.

    .venv/bin/python benchmarks/bench_rllib.py [--seeds 0 1 2] [--rllib-python .venv-rllib/bin/python]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import isolated, machine, median, save, shoal_time_to

TARGET, BUDGET, RUNNERS, EVAL_EVERY = 475.0, 300_000, 2, 4000
EVAL_SEED_OFFSET = 1_000_000  # evaluation episodes start from other seeds than training's
ROOT = Path(__file__).resolve().parent.parent
RUNS = ("shoal", "rllib_tuned", "rllib_shoal")  # the three configurations, in the order they run


def run_shoal(seed: int) -> dict:
    """shoal PPO with its CartPole-v1 preset on the ray backend, evaluated by its own evaluator."""
    import shoal

    config = shoal.make_config("ppo", "CartPole-v1", seed=seed, backend="ray", num_env_runners=RUNNERS,
                               stop_return=TARGET, total_steps=BUDGET, eval_interval=4096, eval_episodes=10,
                               progress=False, tensorboard=False)
    reached = shoal_time_to(config, TARGET)
    return {"seconds": reached.seconds, "steps": reached.steps, "curve": reached.curve}


def play(act, seed: int) -> float:
    """Mean return of 10 deterministic episodes, one on each env of a 10-env vector env."""
    import gymnasium as gym
    import numpy as np

    envs = gym.make_vec("CartPole-v1", num_envs=10, vectorization_mode="sync")
    obs, _ = envs.reset(seed=seed + EVAL_SEED_OFFSET)
    returns, done = np.zeros(10), np.zeros(10, bool)
    while not done.all():
        obs, reward, terminated, truncated, _ = envs.step(act(obs))
        returns += reward * ~done  # steps after an env's first episode ends are not counted
        done |= terminated | truncated
    envs.close()
    return float(returns.mean())


def run_rllib(seed: int, settings: str) -> dict:
    """RLlib PPO with its tuned example's settings ("tuned") or shoal's preset's ("shoal")."""
    import ray
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    start = time.perf_counter()
    ray.init(address="local", include_dashboard=False)  # a new cluster, as shoal starts (never one found on disk)
    config = PPOConfig().environment("CartPole-v1").debugging(seed=seed)
    if settings == "tuned":
        config = (config.env_runners(num_env_runners=RUNNERS)
                  .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear",
                                                             vf_share_layers=True))
                  .training(gamma=0.99, lr=3e-4, num_epochs=6, vf_loss_coeff=0.01, use_kl_loss=True))
    else:
        config = (config.env_runners(num_env_runners=RUNNERS, num_envs_per_env_runner=8, rollout_fragment_length=32)
                  .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh",
                                                             vf_share_layers=False))
                  .training(gamma=0.98, lambda_=0.8, lr=[[0, 1e-3], [100_000, 0.0]], train_batch_size_per_learner=512,
                            minibatch_size=256, num_epochs=20, clip_param=0.2, entropy_coeff=0.0, vf_loss_coeff=0.5,
                            vf_clip_param=float("inf"), grad_clip=0.5, use_kl_loss=False))
    algo = config.build_algo()
    curve, steps, last_eval = [], 0, 0
    try:
        while steps < BUDGET:
            steps = int(algo.train()["num_env_steps_sampled_lifetime"])
            if steps - last_eval < EVAL_EVERY:
                continue
            last_eval = steps
            module = algo.get_module()

            def act(obs):
                with torch.no_grad():
                    logits = module.forward_inference({"obs": torch.as_tensor(obs, dtype=torch.float32)})
                return logits["action_dist_inputs"].argmax(-1).numpy()

            curve.append((steps, time.perf_counter() - start, play(act, seed)))
            if curve[-1][2] >= TARGET:
                break
    finally:
        algo.stop()
        ray.shutdown()
    hit = next((p for p in curve if p[2] >= TARGET), None)
    return {"seconds": hit[1] if hit else float("nan"), "steps": hit[0] if hit else steps, "curve": curve}


def rllib_in_its_venv(python: str, seed: int, settings: str) -> dict:
    """Run :func:`run_rllib` with RLlib's own interpreter; its result comes back as JSON."""
    code = f"import json, bench_rllib; print('RESULT ' + json.dumps(bench_rllib.run_rllib({seed}, {settings!r})))"
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
    print(f"machine: {machine()}; RLlib {version}; target: an evaluation of {TARGET:g} (10 deterministic episodes)")
    rows = []
    for seed in args.seeds:
        row = {"seed": seed, "shoal": isolated(run_shoal, seed)}
        for settings in ("tuned", "shoal"):
            row[f"rllib_{settings}"] = rllib_in_its_venv(args.rllib_python, seed, settings)
        rows.append(row)
        print(f"seed {seed}: " + "  ".join(f"{name} {row[name]['seconds']:.1f} s ({row[name]['steps']:,} steps)"
                                           for name in RUNS), flush=True)
    medians = {name: median([row[name]["seconds"] for row in rows]) for name in RUNS}
    print("median time to the target: " + ", ".join(f"{name} {m:.1f} s" for name, m in medians.items()))
    for name in RUNS[1:]:
        print(f"shoal / {name} = {medians['shoal'] / medians[name]:.2f}")
    path = save("rllib", {"target": TARGET, "runners": RUNNERS, "rllib_version": version, "runs": rows,
                          "median_s": medians})
    print(f"saved {path}")

if __name__ == "__main__":
    main()
