"""Time to a target evaluation, shoal vs RLlib: PPO on CartPole-v1 (475) and SAC on Pendulum-v1 (-200).

Both frameworks are judged by the same evaluation, the one the stable-baselines3 comparisons
use: 10 deterministic episodes, one on each env of a 10-env vector env, every 4,000 env steps or
so (PPO; 2,000 for SAC); a run stops at the first evaluation whose mean reaches the target. Wall
time runs from before the framework starts Ray (imports excluded) to the end of that evaluation,
so start-up, sampling, learning, weight sync and the evaluations are all in it. shoal evaluates
with its own evaluator (as `shoal train` does, with its logging and best-checkpoint writes);
RLlib's policy is played by this script in the driver, from the module `Algorithm.get_module()`
returns (the driver's env runner, synced after every update). An RLlib run still short of the
target after 15 minutes counts as not reaching it.

PPO runs on a fresh local Ray cluster with 2 env runner actors and the learner in the driver on
both sides. SAC steps one env in the driver with one gradient update per env step where the
settings say so: shoal's local backend (its default), RLlib's local env runner (RLlib starts Ray
regardless).

Three configurations per seed and algorithm (SAC's below):
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

SAC: shoal's Pendulum-v1 preset (rl-zoo's: lr 1e-3, 256x256 ReLU networks, batch 256, 100
random steps, tau 0.005, automatic entropy tuning); RLlib's tuned example
`tuned_examples/sac/pendulum_sac.py` (prioritised replay, 2-5-step returns, separate learning
rates; it makes about one update per 6 env steps); and RLlib with shoal's settings (its default buffer
with uniform sampling, 1-step returns, lr 1e-3 for all three losses, one update per env step). RLlib's SAC acts in [-1, 1] and its env runner rescales to the
action bounds (`normalize_actions`); the script's evaluation does the same with RLlib's
`unsquash_action`.

The no-evaluation rule RLlib's examples stop on, `env_runners/episode_return_mean`, is not used:
in RLlib 2.60 it averages the episodes of recent iterations, not a fixed 100 (with 512-step
iterations it jumped from 184 to 500 in one iteration), so it cannot be matched on shoal's side.

RLlib pins gymnasium 1.2.2, so it lives in a virtual environment of its own (`make bench-rllib`
creates `.venv-rllib` with `ray[rllib]` at shoal's Ray version and the same torch); this script
calls that environment's Python for RLlib's runs, each seed in a fresh process per run.

    .venv/bin/python benchmarks/bench_rllib.py [--seeds 0 1 2] [--algos ppo sac] [--rllib-python .venv-rllib/bin/python]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import Reached, isolated, machine, median, save, shoal_time_to

RUNNERS = 2  # PPO's env runner actors on both sides
EVAL_SEED_OFFSET = 1_000_000  # evaluation episodes start from other seeds than training's
ROOT = Path(__file__).resolve().parent.parent
RUNS = ("shoal", "rllib_tuned", "rllib_shoal")  # the three configurations, in the order they run
# algorithm: (env, target, env-step budget, evaluate every, shoal's eval_interval). The budgets are
# shoal's presets' total_steps, over which its learning rate (and PPO's clip range) decay.
TASKS = {"ppo": ("CartPole-v1", 475.0, 100_000, 4000, 4096), "sac": ("Pendulum-v1", -200.0, 20_000, 2000, 2000)}
MAX_SECONDS = 900.0  # an RLlib run that has not reached the target after this long counts as not reaching it


def run_shoal(algo: str, seed: int) -> dict:
    """shoal with its preset for the task, evaluated by its own evaluator (PPO on the ray backend)."""
    import shoal

    env, target, budget, _, eval_interval = TASKS[algo]
    placement = {"backend": "ray", "num_env_runners": RUNNERS} if algo == "ppo" else {}
    config = shoal.make_config(algo, env, seed=seed, stop_return=target, total_steps=budget, eval_interval=eval_interval,
                               eval_episodes=10, progress=False, tensorboard=False, **placement)
    return shoal_time_to(config, target)._asdict()


def play(env: str, act, seed: int) -> float:
    """Mean return of 10 deterministic episodes, one on each env of a 10-env vector env;
    ``act(obs, action_space)`` gives the actions."""
    import gymnasium as gym
    import numpy as np

    envs = gym.make_vec(env, num_envs=10, vectorization_mode="sync")
    obs, _ = envs.reset(seed=seed + EVAL_SEED_OFFSET)
    returns, done = np.zeros(10), np.zeros(10, bool)
    while not done.all():
        obs, reward, terminated, truncated, _ = envs.step(act(obs, envs.single_action_space))
        returns += reward * ~done  # steps after an env's first episode ends are not counted
        done |= terminated | truncated
    envs.close()
    return float(returns.mean())


def rllib_config(algo: str, settings: str, seed: int):
    """RLlib's config: its tuned example's settings ("tuned") or shoal's preset's ("shoal")."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    if algo == "ppo":
        from ray.rllib.algorithms.ppo import PPOConfig

        config = PPOConfig().environment("CartPole-v1").debugging(seed=seed)
        if settings == "tuned":
            return (config.env_runners(num_env_runners=RUNNERS)
                    .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear",
                                                               vf_share_layers=True))
                    .training(gamma=0.99, lr=3e-4, num_epochs=6, vf_loss_coeff=0.01, use_kl_loss=True))
        return (config.env_runners(num_env_runners=RUNNERS, num_envs_per_env_runner=8, rollout_fragment_length=32)
                .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh",
                                                           vf_share_layers=False))
                .training(gamma=0.98, lambda_=0.8, lr=[[0, 1e-3], [TASKS['ppo'][2], 0.0]], train_batch_size_per_learner=512,
                          minibatch_size=256, num_epochs=20, clip_param=0.2, entropy_coeff=0.0, vf_loss_coeff=0.5,
                          vf_clip_param=float("inf"), grad_clip=0.5, use_kl_loss=False))
    from ray.rllib.algorithms.sac import SACConfig
    from torch import nn

    config = SACConfig().environment("Pendulum-v1").debugging(seed=seed)
    if settings == "tuned":
        return (config.training(initial_alpha=1.001, actor_lr=2e-4, critic_lr=8e-4, alpha_lr=9e-4, lr=None,
                                target_entropy="auto", n_step=(2, 5), tau=0.005, train_batch_size_per_learner=256,
                                target_network_update_freq=1, num_steps_sampled_before_learning_starts=256,
                                replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 100000,
                                                      "alpha": 1.0, "beta": 0.0})
                .rl_module(model_config=DefaultModelConfig(
                    fcnet_hiddens=[256, 256], fcnet_activation="relu", fcnet_kernel_initializer=nn.init.xavier_uniform_,
                    head_fcnet_hiddens=[], head_fcnet_activation=None, head_fcnet_kernel_initializer="orthogonal_",
                    head_fcnet_kernel_initializer_kwargs={"gain": 0.01})))
    return (config.training(initial_alpha=1.0, actor_lr=1e-3, critic_lr=1e-3, alpha_lr=1e-3, lr=None,
                            target_entropy="auto", n_step=1, tau=0.005, gamma=0.99, train_batch_size_per_learner=256,
                            target_network_update_freq=1, num_steps_sampled_before_learning_starts=100,
                            replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 1_000_000,
                                                  "alpha": 0.0, "beta": 0.0})  # RLlib's default buffer, uniform
            .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[256, 256], fcnet_activation="relu",
                                                       head_fcnet_hiddens=[])))


def run_rllib(algo: str, seed: int, settings: str) -> dict:
    """RLlib on the task, evaluated by :func:`play` every ``eval_every`` env steps."""
    import ray
    import torch
    from ray.rllib.utils.spaces.space_utils import unsquash_action

    env, target, budget, eval_every, _ = TASKS[algo]
    start = time.perf_counter()
    ray.init(address="local", include_dashboard=False)  # a new cluster, as shoal starts (never one found on disk)
    rllib = rllib_config(algo, settings, seed).build_algo()
    curve, steps, last_eval = [], 0, 0
    try:
        while steps < budget and time.perf_counter() - start < MAX_SECONDS:
            steps = int(rllib.train()["num_env_steps_sampled_lifetime"])
            if steps - last_eval < eval_every:
                continue
            last_eval = steps
            module = rllib.get_module()  # the driver's env runner's: synced after every update
            dist_cls = module.get_inference_action_dist_cls()

            def act(obs, space):
                with torch.no_grad():
                    out = module.forward_inference({"obs": torch.as_tensor(obs, dtype=torch.float32)})
                    action = dist_cls.from_logits(out["action_dist_inputs"]).to_deterministic().sample().numpy()
                return action if algo == "ppo" else unsquash_action(action, space)  # SAC acts in [-1, 1]

            curve.append((steps, time.perf_counter() - start, play(env, act, seed)))
            if curve[-1][2] >= target:
                break
    finally:
        rllib.stop()
        ray.shutdown()
    return Reached.first(curve, target, steps)._asdict()


def rllib_in_its_venv(python: str, algo: str, seed: int, settings: str) -> dict:
    """Run :func:`run_rllib` with RLlib's own interpreter; its result comes back as JSON."""
    call = f"bench_rllib.run_rllib({algo!r}, {seed}, {settings!r})"
    code = f"import json, bench_rllib; print('RESULT ' + json.dumps({call}))"
    out = subprocess.run([python, "-c", code], cwd=Path(__file__).parent, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        sys.exit(f"RLlib's run failed ({algo}, seed {seed}, exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algos", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--rllib-python", default=str(ROOT / ".venv-rllib" / "bin" / "python"),
                        help="the Python of a virtual environment with ray[rllib] (make bench-rllib makes one)")
    args = parser.parse_args()
    if not Path(args.rllib_python).exists():
        sys.exit(f"no RLlib environment at {args.rllib_python}: run `make bench-rllib`, or pass --rllib-python")
    version = subprocess.run([args.rllib_python, "-c", "import ray; print(ray.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    print(f"machine: {machine()}; RLlib {version}; evaluations of 10 deterministic episodes")
    results = {}
    for algo in args.algos:
        env, target, *_ = TASKS[algo]
        print(f"{algo} on {env}, to an evaluation of {target:g}", flush=True)
        rows = []
        for seed in args.seeds:
            row = {"seed": seed, "shoal": isolated(run_shoal, algo, seed)}
            for settings in ("tuned", "shoal"):
                row[f"rllib_{settings}"] = rllib_in_its_venv(args.rllib_python, algo, seed, settings)
            rows.append(row)
            print(f"  seed {seed}: " + "  ".join(f"{name} {row[name]['seconds']:.1f} s ({row[name]['steps']:,} steps)"
                                                 for name in RUNS), flush=True)
        medians = {name: median([row[name]["seconds"] for row in rows]) for name in RUNS}
        print("  median time to the target: " + ", ".join(f"{name} {m:.1f} s" for name, m in medians.items()))
        for name in RUNS[1:]:
            print(f"  shoal / {name} = {medians['shoal'] / medians[name]:.2f}")
        results[algo] = {"env": env, "target": target, "runs": rows, "median_s": medians}
    path = save("rllib", {"rllib_version": version, "ppo_runners": RUNNERS, **results})
    print(f"saved {path}")

if __name__ == "__main__":
    main()
