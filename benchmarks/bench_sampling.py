"""Sampling throughput on CartPole-v1 with the 64x64 MLP policy.

1. shoal's local EnvRunner vs the limit: a bare loop of the same SyncVectorEnv and the same
   policy forward and action sampling (the runner's own fastest call), with nothing else:
   no buffers, no log-probs kept, no episode statistics (target >= 0.8x).
2. The ray backend: 2 runner actors sampling in parallel vs 1 (env steps/s of sampling).

    .venv/bin/python benchmarks/bench_sampling.py [--envs 8] [--steps 20000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from common import machine, save


def bare_loop(config, steps: int) -> float:
    """The limit: step the vector env with the policy's actions, nothing else."""
    from shoal.onpolicy import make_actor_critic
    from shoal.envs import make_vector_env

    env = make_vector_env(config.env, config.num_envs_per_runner)
    module = make_actor_critic(config, env.single_observation_space, env.single_action_space)
    generator = torch.Generator().manual_seed(0)
    obs, _ = env.reset(seed=0)
    n = steps // env.num_envs
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(n):
            a, _ = module.explore(module.normalize(torch.as_tensor(obs)), generator)
            obs, *_ = env.step(module.to_env(a))
    return n * env.num_envs / (time.perf_counter() - start)


def runner_rate(config, steps: int) -> float:
    """shoal's EnvRunner.sample, in-process, rollouts of config.rollout_steps."""
    from shoal.runner import EnvRunner
    from shoal.weights import WeightStore

    runner = EnvRunner(config, 0, WeightStore())
    runner.sample(config.rollout_steps)  # warm-up
    n = max(1, steps // (config.rollout_steps * config.num_envs_per_runner))
    start = time.perf_counter()
    for _ in range(n):
        runner.sample(config.rollout_steps)
    return n * config.rollout_steps * config.num_envs_per_runner / (time.perf_counter() - start)


def ray_rate(config, num_runners: int, steps: int) -> float:
    """env steps/s of ``num_runners`` Ray runner actors sampling in parallel."""
    import ray

    from shoal.backends import RayBackend
    from shoal.runner import EnvRunner

    backend = RayBackend(config)
    store = backend.weight_store()
    runners = [backend.make(EnvRunner, config, i, store, name=f"r{i}", num_cpus=backend.runner_cpus())
               for i in range(num_runners)]
    backend.get([r.call("sample", config.rollout_steps) for r in runners])  # warm-up, actors started
    per_call = config.rollout_steps * config.num_envs_per_runner
    n = max(1, steps // (per_call * num_runners))
    start = time.perf_counter()
    for _ in range(n):
        backend.get([r.call("sample", config.rollout_steps) for r in runners])
    rate = n * per_call * num_runners / (time.perf_counter() - start)
    for r in runners:
        ray.kill(r.actor)
    return rate


def main() -> None:
    from shoal.algos.ppo import PPOConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=40_000)
    parser.add_argument("--rollout-steps", type=int, default=128)
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = PPOConfig(env="CartPole-v1", num_envs_per_runner=args.envs, rollout_steps=args.rollout_steps,
                       minibatch_size=64)
    limit = np.median([bare_loop(config, args.steps) for _ in range(3)])
    ours = np.median([runner_rate(config, args.steps) for _ in range(3)])
    print(f"machine: {machine()}")
    print(f"bare loop (limit):  {limit:9,.0f} env steps/s")
    print(f"shoal EnvRunner:    {ours:9,.0f} env steps/s   ratio {ours / limit:.2f} (target >= 0.8)")
    result = {"limit": limit, "runner": ours, "ratio": ours / limit, "envs": args.envs}
    if not args.no_ray:
        import ray

        ray.init(address="local", include_dashboard=False, logging_level="ERROR")
        ray_config = PPOConfig(**{**config.__dict__, "backend": "ray", "num_env_runners": 2})
        one = ray_rate(PPOConfig(**{**config.__dict__, "backend": "ray", "num_env_runners": 1}), 1, args.steps)
        two = ray_rate(ray_config, 2, args.steps)
        ray.shutdown()
        print(f"ray, 1 runner:      {one:9,.0f} env steps/s")
        print(f"ray, 2 runners:     {two:9,.0f} env steps/s   ratio 2 vs 1: {two / one:.2f}")
        result.update({"ray_1": one, "ray_2": two, "ray_ratio": two / one})
    save("sampling", result)


if __name__ == "__main__":
    main()
