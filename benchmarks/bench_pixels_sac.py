"""SAC from pixels: shoal vs stable-baselines3's SAC CnnPolicy, training throughput on CarRacing-v3.

Both read CarRacing-v3's 96x96x3 frames through the Nature DQN encoder (512 features), one for
the actor and one for the critics (SB3's default for SAC: ``share_features_extractor=False``),
then 256x256 MLPs; twin critics, automatic entropy tuning, one update per env step, batches of
--batch-size, a 10k replay, 2 torch threads each, one env, each framework in a fresh process.
shoal keeps the frames uncompressed here, as SB3 does (``--compress`` times shoal with
``compress_observations``). The figure is env steps per second (one update each) over --steps
steps after 200 warm-up steps (100 random ones, then updates). Learning is not compared:
CarRacing needs hours of updates on these CPUs. ``--device cuda`` puts both frameworks' networks on
the GPU (the device check where one is lent) and times shoal on the CPU too, in the same run.

    .venv/bin/python benchmarks/bench_pixels_sac.py [--steps 300] [--batch-size 64] [--compress] [--device cuda]
        [--runner-device cuda]
"""

from __future__ import annotations

import argparse

from common import isolated, machine, sb3_steps_per_s, save, shoal_steps_per_s

ENV, WARMUP, START, THREADS = "CarRacing-v3", 200, 100, 2


def shoal_rate(steps: int, batch_size: int, compress: bool, device: str = "cpu", runner_device: str = "cpu") -> float:
    import shoal

    config = shoal.make_config("sac", ENV, device=device, runner_device=runner_device, total_steps=10**9,
                               batch_size=batch_size, buffer_size=10_000,
                               learning_starts=START, eval_interval=0, torch_threads=THREADS,
                               compress_observations=compress, progress=False, tensorboard=False)
    return shoal_steps_per_s(config, steps, WARMUP)


def sb3_rate(steps: int, batch_size: int, device: str = "cpu") -> float:
    import torch
    from stable_baselines3 import SAC

    torch.set_num_threads(THREADS)
    model = SAC("CnnPolicy", ENV, batch_size=batch_size, buffer_size=10_000, learning_starts=START, seed=0,
                device=device)
    return sb3_steps_per_s(model, steps, WARMUP)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--compress", action="store_true", help="shoal with compress_observations too")
    parser.add_argument("--device", default="cpu", help="where both frameworks' networks train (cuda: a GPU)")
    parser.add_argument("--runner-device", default="cpu", help="where shoal's runner acts (SB3 acts on --device)")
    args = parser.parse_args()
    print(f"machine: {machine()}; networks on {args.device}, shoal's runner on {args.runner_device}")
    ours = isolated(shoal_rate, args.steps, args.batch_size, False, args.device, args.runner_device)
    theirs = isolated(sb3_rate, args.steps, args.batch_size, args.device)
    result = {"shoal": ours, "sb3": theirs, "steps": args.steps, "batch_size": args.batch_size, "device": args.device,
              "runner_device": args.runner_device}
    print(f"SAC on {ENV}, batch {args.batch_size}, {args.steps} steps, {args.device}: shoal {ours:.1f} steps/s, "
          f"SB3 {theirs:.1f} -> {ours / theirs:.2f}x SB3", flush=True)
    if args.device != "cpu":
        cpu = result["shoal_cpu"] = isolated(shoal_rate, args.steps, args.batch_size, False, "cpu")
        print(f"shoal with its networks on the CPU ({THREADS} threads): {cpu:.1f} steps/s -> {args.device} "
              f"{ours / cpu:.2f}x the CPU", flush=True)
    if args.compress:
        packed = isolated(shoal_rate, args.steps, args.batch_size, True, args.device)
        result["shoal_compressed"] = packed
        print(f"shoal with compress_observations: {packed:.1f} steps/s ({packed / ours:.2f} of uncompressed)")
    print(f"wrote {save('pixels_sac', result)}")


if __name__ == "__main__":
    main()
