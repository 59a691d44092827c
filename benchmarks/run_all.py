"""Run every benchmark in turn (`make bench`); each prints its figures and ratios.

Figures vary 20-40% run to run on a shared 2-core machine: compare ratios taken in one run.
"""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
SCRIPTS = ["bench_sampling.py", "bench_startup.py", "bench_cartpole_vs_sb3.py", "bench_offpolicy_vs_sb3.py",
           "bench_denormals.py", "bench_async.py", "bench_remote.py", "bench_grpc_floor.py", "bench_atari.py",
           "bench_recurrent.py", "bench_frame_stack.py", "bench_masking.py", "bench_export.py", "bench_her.py",
           "bench_ou_noise.py", "bench_gsde.py", "bench_gsde.py --algo ppo", "bench_rainbow.py",
           "bench_ars.py", "bench_ars.py --env MountainCarContinuous-v0",
           "bench_replay_memory.py", "bench_pixels_sac.py", "bench_mujoco.py", "bench_mujoco.py --algo ppo",
           "bench_mujoco.py --algo trpo",
           "bench_device.py", "bench_tune.py",
           "bench_lunar_sac.py"]  # the last takes longest: 15-30 minutes for its one seed

if __name__ == "__main__":
    failed = []
    for script in SCRIPTS:
        print(f"\n=== {script} ===", flush=True)
        name, *args = script.split()  # a script, then its arguments
        if subprocess.run([sys.executable, str(HERE / name), *args], cwd=HERE).returncode != 0:
            failed.append(script)
    sys.exit(f"failed: {', '.join(failed)}" if failed else 0)
