"""Configuration shared by every algorithm, and the layering of presets, files and overrides.

A config is a frozen dataclass; each field's docstring becomes its ``--help`` line. Values come
from, in rising priority: the dataclass defaults, the shipped preset for (algorithm, env), a
YAML file (``--config``), ``--set key=value`` pairs, and explicit flags.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import functools
import math
import numbers
import re
import types
import typing
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from shoal.errors import ConfigError

SEED_LIMIT = 2**32
"""Seeds are below this, as NumPy's legacy seeding and stable-baselines3 take them: shoal derives
each runner's, env's and evaluator's seed by adding offsets (millions), and torch's generators
take no more than 64 bits."""


@dataclass(frozen=True)
class Config:
    """Settings every algorithm shares: what it trains on, where, for how long, and what it writes."""

    env: str = "CartPole-v1"
    """Gymnasium environment id (`shoal envs` lists them), or env servers:
    remote://HOST:PORT[,HOST:PORT...][/ENV_ID] (--env repeated, or a list in a config file, joins them).
    In Python, a gymnasium.Env subclass too (it becomes its id: 'module:ClassName')."""
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of the env's constructor, as gym.make(env, **env_kwargs) takes them:
    --env-kwargs is_slippery=false map_name=8x8 (values read as YAML)."""
    frame_stack: int | None = None
    """Observe the last N observations stacked together, so that a feed-forward policy sees motion
    (CartPoleNoVel-v1's velocities, a car's speed): vectors become [N, ...], images get N times
    their channels. Default: 4 for Atari games (part of their preprocessing), else none (1)."""
    info_action_mask: bool = False
    """Read the legal actions from info["action_mask"] after each reset and step (Gymnasium's Taxi
    gives it there), as an observation's action_mask entry is read."""
    env_wrappers: list[str | dict[str, Any]] = dataclasses.field(default_factory=list)
    """Wrappers around every env the run makes (rl-zoo's env_wrapper, SB3's wrapper_class),
    innermost first: 'module:Name' (a gymnasium.Wrapper class, or a function taking the env), or
    {'module:Name': {keyword arguments}}: --env-wrapper gymnasium.wrappers:TimeLimit
    max_episode_steps=100, repeatable. They wrap the env as gym.make gives it (an Atari game once
    preprocessed), before shoal flattens its observations or stacks them. The returns shoal reports
    are the wrapped env's. In Python, the class or function itself too."""
    backend: Literal["local", "ray"] = "local"
    """Where the roles run: `local` (one process) or `ray` (each role a Ray actor)."""
    address: str | None = None
    """Ray cluster to join (`auto`, or host:port); default: RAY_ADDRESS's (as a Ray Job's entrypoint
    gets it) if set, else a new local cluster. Ray backend only."""
    num_env_runners: int = 1
    """Number of env runners sampling in parallel."""
    num_envs_per_runner: int = 8
    """Environments stepped together (one vector env) in each runner."""
    seed: int = 0
    """Seed for networks, environments and sampling; a local run with one seed is deterministic."""
    total_steps: int = 100_000
    """Stop after this many environment steps."""
    clip_rewards: bool = False
    """Learn from the sign of each reward (-1, 0 or 1), as DQN's Atari agents did; the returns
    shoal reports stay the env's own."""
    episode_info: tuple[str, ...] = ()
    """Keys of the env's info to log at the end of each episode: for training episodes as
    episode/KEY, the mean over the last 100 that gave a number for it; for each evaluation's as
    eval/KEY (stable-baselines3 Monitor's info_keywords, RLlib's custom metrics).
    --episode-info is_success score."""
    stop_return: float | None = None
    """Stop early once the mean evaluation return reaches this value."""
    stop_patience: int | None = None
    """Stop once this many evaluations in a row have not beaten the best evaluation's mean return
    (stable-baselines3's StopTrainingOnNoModelImprovement); checkpoints/best keeps the best."""
    stop_time_s: float | None = None
    """Stop once the run's wall time (time/wall_s: sampling, learning, evaluations, checkpoints, and
    the sessions before a resume) reaches this many seconds; the run then evaluates and saves."""
    stop_episodes: int | None = None
    """Stop once this many training episodes have ended, every runner's env's together (and the
    sessions' before a resume): stable-baselines3's StopTrainingOnMaxEpisodes (which counts them
    per env), RLlib's num_episodes_lifetime; the run then evaluates and saves."""
    run_dir: str | None = None
    """Directory for config, metrics, checkpoints and plots (default: runs/ALGO-ENV-TIME)."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the policy and value networks (the value network's unless
    critic_hidden_sizes gives its own; image observations with shoal's convolutional encoder:
    linear heads on its features instead)."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden-layer activation."""
    encoder: str | None = None
    """Your own feature extractor, 'module:ClassName': a torch.nn.Module subclass built as
    ClassName(input_space, **encoder_kwargs). It reads a batch of flat float32 observations [N, D]
    (images: [N, C, H, W] scaled to [0, 1]) and returns features [N, K], which the algorithm's MLPs
    (hidden_sizes) then read; off-policy critics get an encoder of their own. In Python, the class
    itself too. Not with trpo."""
    encoder_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of the --encoder class: --encoder-kwargs width=128 (values read as YAML)."""
    eval_interval: int = 5_000
    """Evaluate every this many environment steps (0: only at the end)."""
    eval_episodes: int = 10
    """Episodes per evaluation."""
    eval_deterministic: bool = True
    """Evaluate with the most likely action instead of a sampled one."""
    eval_env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of the evaluation envs' constructor, over env_kwargs (rl-zoo's
    eval_env_kwargs): evaluations, videos and `shoal eval RUN_DIR` make their envs with them, to
    judge a policy where it did not train (--eval-env-kwargs map_name=8x8). Their spaces must be
    the training env's."""
    eval_max_steps: int = 10_000
    """An evaluation episode that has not ended after this many steps is cut there (an env with no
    time limit, such as CliffWalking-v1, would never end a poor policy's episode)."""
    init_from: str | None = None
    """Start the networks from this run directory's newest checkpoint (or this checkpoint), of the
    same algorithm, with these settings (rl-zoo's --trained-agent, SB3's load then learn): its
    policy and the algorithm's other networks (critics, targets, SAC's temperature); optimisers,
    counters and the replay buffer start afresh (--init-replay fills it). The env may differ where
    its spaces are the checkpoint's; the settings that shape the network must be its own."""
    video_interval: int = 0
    """Record one episode of the current policy, as its evaluations play it (their first
    episode's seed, deterministic or not, eval_max_steps), to RUN_DIR/videos/step_N.mp4 every this
    many environment steps and at the end (0: none; CleanRL's capture_video). The env must render
    'rgb_array' frames."""
    checkpoint_interval: int = 25_000
    """Write a checkpoint every this many environment steps (and always at the end)."""
    keep_checkpoints: int = 3
    """How many recent checkpoints to keep (the best one is kept apart)."""
    inference: Literal["local", "central"] = "local"
    """`local`: each runner holds a policy copy; `central`: runners send observations to
    inference server roles that batch them into one forward pass (SEED RL style)."""
    num_inference_servers: int = 1
    """Inference servers with --inference central; runner i uses server i % this."""
    max_env_restarts: int = 100
    """Envs a runner may replace after they raise before the runner itself is restarted."""
    runner_timeout_s: float = 120.0
    """A runner that does not finish a rollout within this is treated as dead and replaced (Ray)."""
    max_runner_restarts: int = 100
    """Runner restarts allowed in a run before it fails."""
    max_failures: int = 0
    """Ray backend: restart the roles from the newest checkpoint this many times after a learner
    or other role fails, before the run fails."""
    torch_threads: int = 1
    """Torch threads per process; small MLPs run fastest on one (see MEASURED.md)."""
    runner_torch_threads: int = 1
    """Torch threads of each env runner's process on the ray backend, where Ray reserves one CPU
    per runner (in-process, runners share the driver's torch_threads). Their forward passes over a
    few envs gain nothing from more, and several runners' threads on the same cores wait for each
    other: two CrossQ runners on 2 cores sampled 8 steps each in 48-68 ms at once with 2 threads,
    against 9-16 ms with 1 (BENCHMARKS.md)."""
    device: str = "cpu"
    """Where the learner's networks train (and --inference central's servers act): cpu, cuda,
    cuda:N, or auto (cuda where there is one). Runners act where --runner-device says, and
    evaluators on the CPU, with the weights the learner publishes. On the ray backend a learner on
    cuda or auto asks Ray for a GPU. Small MLPs are expected to gain little from a GPU; image
    observations and large networks are what it is for."""
    runner_device: str = "cpu"
    """Where runners compute their actions: cpu, cuda, cuda:N or auto. On a GPU each env step
    uploads the observations and waits once for the actions, as stable-baselines3 acts on its
    model's device (RLlib: num_gpus_per_env_runner). Meant for convolutional networks where CPU
    cores are few or busy: with 16 cores, DQN on Breakout gained nothing measurable (BENCHMARKS.md).
    On the ray backend each runner asks Ray for a share of a GPU (they share half of one with a
    learner on cuda)."""
    progress: bool = True
    """Show a live progress bar (a plain line every 30 s where stderr is not a terminal)."""
    tensorboard: bool = True
    """Write TensorBoard event files beside the CSV metrics."""
    wandb_project: str | None = None
    """Track the run in Weights & Biases under this project (rl-zoo's and CleanRL's --track): its
    settings, every row of progress.csv and eval.csv against env_steps, and its --video-interval
    videos; a resume goes on with the same W&B run. Needs the wandb extra (pip install
    'shoal[wandb]') and `wandb login`, or WANDB_MODE=offline to keep it in RUN_DIR/wandb for
    `wandb sync`."""
    wandb_entity: str | None = None
    """The W&B team or user the run goes to (default: the logged-in user's)."""
    wandb_group: str | None = None
    """The W&B group of the run (default: for --seeds and shoal tune, their directory's name)."""
    wandb_tags: tuple[str, ...] = ()
    """Tags of the W&B run (rl-zoo's --tags): --wandb-tags baseline v2."""
    log_interval: int = 1
    """Write a row of progress.csv and TensorBoard once per this many environment steps: the
    first iteration at or past each multiple, and the last one (1: every iteration). Its
    env_steps_per_s is the rate since the row before."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # a config made in Python gets the checks --set values get
            value = getattr(self, f.name)
            if f.name != "env" and (coerced := _coerce(type(self), f.name, value)) is not value:
                object.__setattr__(self, f.name, coerced)
        if not isinstance(self.env, str):  # several remote:// servers as a list (a config file), or an env class
            object.__setattr__(self, "env", env_setting(self.env))
        _check(0 <= self.seed < SEED_LIMIT, f"seed must be from 0 to {SEED_LIMIT - 1} (Gymnasium and NumPy take no "
               f"negative seeds, torch none past 64 bits, and shoal adds offsets to it), got {self.seed}")
        _check(self.num_env_runners >= 1, "num_env_runners must be at least 1")
        _check(self.num_envs_per_runner >= 1, "num_envs_per_runner must be at least 1")
        _check(self.total_steps >= 1, "total_steps must be positive")
        _check(self.eval_interval >= 0, "eval_interval must be 0 (end only) or positive")
        _check(self.eval_episodes >= 1, "eval_episodes must be at least 1")
        _check(self.eval_max_steps >= 1, "eval_max_steps must be at least 1")
        _check(self.video_interval >= 0, "video_interval must be 0 (no videos) or positive")
        _check(self.checkpoint_interval >= 1, "checkpoint_interval must be positive")
        _check(self.log_interval >= 1, "log_interval must be at least 1")
        _check(self.keep_checkpoints >= 1, "keep_checkpoints must be at least 1")
        _check(self.torch_threads >= 1, "torch_threads must be at least 1")
        _check(self.runner_torch_threads >= 1, "runner_torch_threads must be at least 1")
        from shoal.devices import named

        for flag, spec, role in (("--device", self.device, "the learner uses the GPU Ray gives it"),
                                 ("--runner-device", self.runner_device, "runners use the GPU share Ray gives them")):
            _check(named(spec), f"{flag} must be cpu, cuda, cuda:N or auto, got {spec!r}")
            _check(self.backend != "ray" or ":" not in spec,
                   f"{flag} {spec}: on the ray backend {role}: give {flag} cuda")
        _check(self.runner_device == "cpu" or self.inference == "local", f"--runner-device {self.runner_device} "
               "cannot be combined with --inference central: the runners then hold no policy, and the inference "
               "servers act on --device")
        _check(self.num_inference_servers >= 1, "num_inference_servers must be at least 1")
        _check(self.num_inference_servers == 1 or self.inference == "central",
               f"num_inference_servers {self.num_inference_servers} sets how many central inference servers act for "
               "the runners: add --inference central")
        _check(self.inference != "central" or self.num_inference_servers <= self.num_env_runners,
               f"num_inference_servers {self.num_inference_servers} is more than num_env_runners "
               f"{self.num_env_runners}: runner i uses server i % {self.num_inference_servers}, so "
               f"{self.num_inference_servers - self.num_env_runners} would serve no one")
        _check(self.max_env_restarts >= 0 and self.max_runner_restarts >= 0 and self.max_failures >= 0,
               "max_env_restarts, max_runner_restarts and max_failures must be >= 0")
        _check(self.runner_timeout_s > 0, "runner_timeout_s must be positive")
        _check(self.stop_time_s is None or self.stop_time_s > 0, "stop_time_s must be positive (or None)")
        _check(self.stop_episodes is None or self.stop_episodes >= 1, "stop_episodes must be at least 1 (or None)")
        _check(self.wandb_project is not None or (self.wandb_entity is None and self.wandb_group is None
                                                  and not self.wandb_tags),
               "wandb_entity, wandb_group and wandb_tags place a run tracked in W&B: give --wandb-project too")
        _check(self.wandb_project is None or bool(self.wandb_project.strip()), "wandb_project cannot be empty")
        _check(self.stop_patience is None or self.stop_patience >= 1, "stop_patience must be at least 1 evaluation "
               "(or None)")
        _check(self.eval_interval > 0 or (self.stop_return is None and self.stop_patience is None),
               "stop_return and stop_patience stop a run at an evaluation, and eval_interval 0 evaluates at the end "
               "only: give --eval-interval N (env steps) too")
        _check("render_mode" not in self.env_kwargs, "env_kwargs cannot set render_mode: training envs do not "
               "render; `shoal eval RUN_DIR --video DIR` records episodes")
        _check("render_mode" not in self.eval_env_kwargs, "eval_env_kwargs cannot set render_mode: evaluations do "
               "not render; --video-interval N and `shoal eval RUN_DIR --video DIR` record episodes")
        _check(len(self.hidden_sizes) >= 1 and min(self.hidden_sizes) >= 1,
               "hidden_sizes needs at least one positive width, e.g. --hidden-sizes 64 64")
        critic = getattr(self, "critic_hidden_sizes", None)
        _check(critic is None or (len(critic) >= 1 and min(critic) >= 1),
               "critic_hidden_sizes needs at least one positive width, e.g. --critic-hidden-sizes 256 256")
        if self.encoder is not None:
            _check_encoder(self.encoder)
        _check(self.encoder is not None or not self.encoder_kwargs,
               "encoder_kwargs are the --encoder class's keyword arguments: give --encoder module:ClassName too")
        _check(self.address is None or self.backend == "ray",
               "--address joins a Ray cluster: add --backend ray")
        check_episode_info(self.episode_info, "episode_info")
        from shoal.envs import EnvOptions

        EnvOptions.of(self)  # checks frame_stack
        if not self.env.startswith("remote://"):
            from shoal.envs import check_env_id

            check_env_id(self.env)
        elif self.env_kwargs or self.eval_env_kwargs:
            from shoal.envs import REMOTE_KWARGS

            raise ConfigError(REMOTE_KWARGS)
        elif self.frame_stack is not None or self.info_action_mask or self.env_wrappers:
            from shoal.envs import REMOTE_OPTIONS

            raise ConfigError(REMOTE_OPTIONS)
        else:
            _check(not self.video_interval, "video_interval records a local env, and env servers' envs are not "
                   "rendered here: record the run's checkpoints with `shoal eval RUN_DIR --env ENV_ID --video DIR`")

    @property
    def num_envs(self) -> int:
        """Environments across all runners."""
        return self.num_env_runners * self.num_envs_per_runner


OWN_EPISODE_KEYS = {"count", "return_mean", "length_mean", "return_std", "episodes", "success_rate",
                    "policy_version"}
"""What shoal logs as episode/NAME and eval/NAME itself: --episode-info keys of these names are refused."""


def eval_env_kwargs(config: Any) -> dict[str, Any]:
    """The keyword arguments a run's evaluation envs are made with: its env_kwargs, then its
    eval_env_kwargs over them."""
    return {**config.env_kwargs, **config.eval_env_kwargs}


def check_episode_info(keys: tuple[str, ...], name: str) -> None:
    """Info keys to report (``--episode-info``): named, and none of shoal's own metrics' names."""
    taken = sorted(set(keys) & OWN_EPISODE_KEYS)
    _check(all(keys), f"{name} takes info keys, not an empty name")
    _check(not taken, f"{name}: {', '.join(taken)} would replace shoal's own episode/ and eval/ metrics of that "
           "name; wrap the env so that its info gives the value under another key")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def check_sde(config: Any) -> None:
    """The checks of a config's gSDE settings (``use_sde``, ``sde_sample_freq``)."""
    _check(config.sde_sample_freq == -1 or config.sde_sample_freq >= 1, "sde_sample_freq must be -1 (once per "
           "rollout) or at least 1")
    _check(not config.use_sde or config.inference == "local", "--use-sde holds a noise matrix per env in each "
           "runner's policy: it cannot be combined with --inference central, whose servers act for every "
           "runner's envs")


def critic_sizes(config: Any) -> tuple[int, ...]:
    """The critics' (value network's) hidden widths: ``critic_hidden_sizes``, or where it is unset
    the policy's ``hidden_sizes``."""
    return config.hidden_sizes if config.critic_hidden_sizes is None else config.critic_hidden_sizes


OWN_LRS = ("actor_lr", "critic_lr", "alpha_lr")
"""Settings of a network's own learning rate (unset: lr), in the algorithms that have them."""


# Settings as stable-baselines3 (and rl-zoo, sb3-contrib) or RLlib name them, and shoal's names for
# them: a user who types the name they know is told shoal's. Each entry: whose name it is, and
# shoal's settings it may mean, the first the algorithm has named, with how it differs ({name}: a
# setting, spelled as a flag or as a key, as the name was given).
PEER_NAMES: dict[str, tuple[str, dict[str, str]]] = {
    "learning_rate": ("SB3's", {"lr": ""}),
    "n_steps": ("SB3's", {"rollout_steps": ""}),
    "train_freq": ("SB3's", {"rollout_steps": ""}),
    "gradient_steps": ("SB3's", {"updates_per_step": ", in updates per env step (gradient_steps / train_freq)"}),
    "n_epochs": ("SB3's", {"num_epochs": ""}),
    "batch_size": ("SB3's PPO", {"minibatch_size": ""}),
    "clip_range": ("SB3's", {"clip": ""}),
    "clip_range_vf": ("SB3's", {"vf_clip": ""}),
    "normalize_advantage": ("SB3's", {"normalize_advantages": ""}),
    "ent_coef": ("SB3's SAC", {"alpha": " (a fixed value; unset, it is tuned from {alpha_init}, as SB3's 'auto')"}),
    "target_policy_noise": ("SB3's", {"target_noise": ""}),
    "n_envs": ("SB3's", {"num_envs_per_runner": ""}),
    "total_timesteps": ("SB3's", {"total_steps": ""}),
    "n_timesteps": ("rl-zoo's", {"total_steps": ""}),
    "normalize": ("rl-zoo's", {"normalize_obs": " and {normalize_rewards}"}),
    "net_arch": ("SB3's", {"hidden_sizes": " (its pi; {critic_hidden_sizes} is its vf or qf where they differ)"}),
    "activation_fn": ("SB3's", {"activation": ""}),
    "target_kl": ("sb3-contrib's TRPO", {"max_kl": ""}),
    "cg_max_steps": ("sb3-contrib's", {"cg_iters": ""}),
    "n_critic_updates": ("sb3-contrib's", {"vf_epochs": ""}),
    "n_directions": ("the ARS paper's code", {"n_delta": ""}),
    "deltas_used": ("the ARS paper's code", {"n_top": ""}),
    "num_rollouts": ("RLlib's ARS", {"n_delta": ""}),
    "rollouts_used": ("RLlib's ARS", {"n_top": ""}),
    "noise_stdev": ("RLlib's ARS", {"delta_std": ""}),
    "clip_param": ("RLlib's", {"clip": ""}),
    "vf_clip_param": ("RLlib's", {"vf_clip": ""}),
    "entropy_coeff": ("RLlib's", {"ent_coef": "", "alpha": ""}),  # SAC's: its alpha
    "vf_loss_coeff": ("RLlib's", {"vf_coef": ""}),
    "lambda": ("RLlib's", {"gae_lambda": ""}),
    "lambda_": ("RLlib's", {"gae_lambda": ""}),
    "grad_clip": ("RLlib's", {"max_grad_norm": ""}),
    "num_sgd_iter": ("RLlib's", {"num_epochs": ""}),
    "sgd_minibatch_size": ("RLlib's", {"minibatch_size": ""}),
    "train_batch_size": ("RLlib's", {"batch_size": "", "rollout_steps": ", counted per env (train_batch_size / "
                                                                       "({num_env_runners} x {num_envs_per_runner}))"}),
    "rollout_fragment_length": ("RLlib's", {"rollout_steps": ""}),
    "num_workers": ("RLlib's", {"num_env_runners": ""}),
    "num_rollout_workers": ("RLlib's", {"num_env_runners": ""}),
    "num_envs_per_worker": ("RLlib's", {"num_envs_per_runner": ""}),
    "num_envs_per_env_runner": ("RLlib's", {"num_envs_per_runner": ""}),
    "fcnet_hiddens": ("RLlib's", {"hidden_sizes": ""}),
    "fcnet_activation": ("RLlib's", {"activation": ""}),
    "target_network_update_freq": ("RLlib's", {"target_update_interval": ""}),
    "double_q": ("RLlib's", {"double": ""}),
    "adam_epsilon": ("RLlib's", {"optimizer_eps": ""}),
    "rms_prop_eps": ("SB3's A2C", {"optimizer_eps": ""}),
    "sigma0": ("RLlib's", {"noisy_sigma0": ""}),
    "twin_q": ("RLlib's", {"twin_critics": "", "n_critics": " (2 for twin_q true, 1 for false)"}),
    "initial_alpha": ("RLlib's", {"alpha_init": ""}),
    "num_steps_sampled_before_learning_starts": ("RLlib's", {"learning_starts": ""}),
    "capacity": ("RLlib's", {"buffer_size": ""}),
    "prioritized_replay": ("RLlib's", {"prioritized": ""}),
    "prioritized_replay_alpha": ("RLlib's", {"priority_alpha": ""}),
    "prioritized_replay_beta": ("RLlib's", {"priority_beta": ""}),
    "vtrace_clip_rho_threshold": ("RLlib's", {"vtrace_rho_bar": ""}),
    "time_total_s": ("RLlib's", {"stop_time_s": ""}),
    "num_episodes_lifetime": ("RLlib's", {"stop_episodes": ""}),
    "max_episodes": ("SB3's StopTrainingOnMaxEpisodes", {"stop_episodes": ", counted over every env together "
                                                                         "(SB3's max_episodes x n_envs)"}),
    "num_gpus": ("RLlib's", {"device": ""}),
    "env_wrapper": ("rl-zoo's", {"env_wrappers": " (the same list)"}),
    "wrapper_class": ("SB3's", {"env_wrappers": " (a list of them)"}),
    "info_keywords": ("SB3 Monitor's", {"episode_info": ""}),
    "trained_agent": ("rl-zoo's", {"init_from": " (a run directory or checkpoint)"}),
    "max_no_improvement_evals": ("SB3's", {"stop_patience": ""}),
    "capture_video": ("CleanRL's", {"video_interval": " (env steps between videos; 0: none)"}),
    "track": ("rl-zoo's and CleanRL's", {"wandb_project": " (a W&B project: giving one turns tracking on)"}),
    "wandb_project_name": ("rl-zoo's and CleanRL's", {"wandb_project": ""}),
    "policy_lr": ("CleanRL's", {"actor_lr": ""}),
    "q_lr": ("CleanRL's", {"critic_lr": ""}),
    "policy_frequency": ("CleanRL's", {"policy_delay": ""}),
    "train_frequency": ("CleanRL's", {"rollout_steps": ""}),
    "target_network_frequency": ("CleanRL's", {"target_update_interval": ""}),
    "start_e": ("CleanRL's", {"exploration_initial_eps": ""}),
    "end_e": ("CleanRL's", {"exploration_final_eps": ""}),
    "exploration_noise": ("CleanRL's", {"action_noise": ""}),
    "policy_noise": ("CleanRL's", {"target_noise": ""}),
    "noise_clip": ("CleanRL's", {"target_noise_clip": ""}),
    "num_envs": ("CleanRL's", {"num_envs_per_runner": ""}),
    "num_steps": ("CleanRL's", {"rollout_steps": ""}),
    "update_epochs": ("CleanRL's", {"num_epochs": ""}),
    "num_minibatches": ("CleanRL's", {"minibatch_size": ", in transitions ({rollout_steps} x {num_envs_per_runner} x "
                                                        "{num_env_runners} / num_minibatches)"}),
    "clip_coef": ("CleanRL's", {"clip": ""}),
    "norm_adv": ("CleanRL's", {"normalize_advantages": ""}),
    "anneal_lr": ("CleanRL's", {"lr_schedule": " linear"}),
    "clip_vloss": ("CleanRL's", {"vf_clip": ", a range of its own (CleanRL clips the value by clip_coef: give it "
                                           "{clip}'s value)"}),
    "env_id": ("CleanRL's", {"env": ""}),
    "autotune": ("CleanRL's", {"alpha": " (unset: tuned, as autotune; a value fixes it)"}),
    "cuda": ("CleanRL's", {"device": " cuda (the default: cpu)"}),
    "eval_freq": ("SB3's", {"eval_interval": ", in env steps over every env (SB3's eval_freq x n_envs)"}),
    "n_eval_episodes": ("SB3's", {"eval_episodes": ""}),
    "save_freq": ("SB3's CheckpointCallback", {"checkpoint_interval": ", in env steps over every env (save_freq x "
                                                                      "n_envs)"}),
    "tensorboard_log": ("SB3's", {"run_dir": " (TensorBoard's files go in RUN_DIR/tb)"}),
    "log_folder": ("rl-zoo's", {"run_dir": ""}),
    "num_threads": ("rl-zoo's", {"torch_threads": ""}),
    "save_replay_buffer": ("rl-zoo's", {"save_replay": ""}),
    "optimize_memory_usage": ("SB3's", {"compress_observations": " (LZ4-compressed rows: a fraction of the memory "
                                                                 "of SB3's optimised buffer)"}),
    "policy_kwargs": ("SB3's", {"hidden_sizes": " (its net_arch; its activation_fn is {activation})"}),
    "evaluation_interval": ("RLlib's", {"eval_interval": ", in env steps (RLlib's counts iterations)"}),
    "evaluation_duration": ("RLlib's", {"eval_episodes": " (evaluation_duration_unit episodes)"}),
    "checkpoint_freq": ("Ray Tune's", {"checkpoint_interval": ", in env steps (Tune's counts iterations)"}),
    "checkpoint_frequency": ("Ray Tune's", {"checkpoint_interval": ", in env steps (Tune's counts iterations)"}),
    "store_buffer_in_checkpoints": ("RLlib's", {"save_replay": ""}),
    "num_replay_buffer_shards": ("RLlib's Ape-X", {"num_replay_shards": ""}),
    "training_intensity": ("RLlib's", {"updates_per_step": ", in updates per env step (training_intensity / "
                                                           "{batch_size})"}),
    "samples_per_insert": ("Reverb's", {"updates_per_step": ", in updates per env step (samples_per_insert / "
                                                            "{batch_size})"}),
    "actor_hiddens": ("RLlib's", {"hidden_sizes": ""}),
    "critic_hiddens": ("RLlib's", {"critic_hidden_sizes": "", "hidden_sizes": " (the actor's and the critics' alike)"}),
    "actor_hidden_activation": ("RLlib's", {"activation": ""}),
    "critic_hidden_activation": ("RLlib's", {"activation": " (the actor's and the critics' alike)"}),
    "actor_learning_rate": ("RLlib's", {"actor_lr": ""}),
    "critic_learning_rate": ("RLlib's", {"critic_lr": ""}),
    "entropy_learning_rate": ("RLlib's", {"alpha_lr": ""}),
}


def peer_hint(cls: type, name: str, flags: bool = False) -> str | None:
    """What shoal calls a setting that stable-baselines3 or RLlib call ``name`` (a flag's spelling
    or a key's), if ``cls`` has it: "SB3's clip_range: shoal calls it --clip". None otherwise. A
    class's own ``PEER_NAMES`` (a command's arguments) add to the table."""
    key = name.lstrip("-").replace("-", "_")
    whose, ours = {**PEER_NAMES, **getattr(cls, "PEER_NAMES", {})}.get(key, ("", {}))
    ours_here = [(n, note) for n, note in ours.items() if n in field_names(cls)]
    if not ours_here or key in field_names(cls):
        return None
    spell = (lambda n: "--" + n.replace("_", "-")) if flags else (lambda n: n)  # noqa: E731
    ours, note = ours_here[0]
    if not set(re.findall(r"\{(\w+)\}", note)) <= set(field_names(cls)):  # about a setting this algorithm lacks
        note = ""
    return f"{whose} {key}: shoal calls it {spell(ours)}" + re.sub(r"\{(\w+)\}", lambda m: spell(m[1]), note)


def owners_hint(cls: type, name: str, flags: bool = False) -> str | None:
    """Which other algorithms have the setting ``name`` that the algorithm config ``cls`` lacks:
    "--buffer-size is a setting of crossq, ... and tqc, not of ppo". None where ``cls`` has it,
    no algorithm does, or ``cls`` is not an algorithm's config (a command's arguments)."""
    from shoal.algos import ALGOS

    key = name.lstrip("-").replace("-", "_")
    mine = [n for n, spec in ALGOS.items() if spec.config_cls is cls]
    owners = sorted(n for n, spec in ALGOS.items() if key in field_names(spec.config_cls))
    if not mine or not owners or key in field_names(cls):
        return None
    listed = owners[0] if len(owners) == 1 else f"{', '.join(owners[:-1])} and {owners[-1]}"
    return f"{'--' + key.replace('_', '-') if flags else key} is a setting of {listed}, not of {mine[0]}"


def field_names(cls: type) -> list[str]:
    """The config fields of a config class, in declaration order."""
    return [f.name for f in dataclasses.fields(cls)]


def _coerce(cls: type, key: str, value: Any) -> Any:
    """Convert a YAML/--set value to the field's type (tuples from lists, floats from ints)."""
    hint = _hints(cls)[key]
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    optional = origin in (typing.Union, types.UnionType) and type(None) in args
    if value is None:
        if not optional:
            raise ConfigError(f"{key} needs a value (give {key}=VALUE)")
        return None
    if key == "encoder" and isinstance(value, type):  # the class itself, in Python
        from shoal.envs import callable_path

        return callable_path(value, "encoder", "my_encoders.py")
    if key == "env_wrappers":
        from shoal.envs import wrapper_specs

        return wrapper_specs(value)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        hint = non_none[0] if len(non_none) == 1 else hint
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{key} expects a mapping of names to values, such as {{is_slippery: false}}; "
                              f"got {value!r}")
        return dict(value)
    if origin is tuple:
        items = value if isinstance(value, (list, tuple)) else [value]
        try:
            return tuple(_coerce_item(args[0], v) for v in items)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} expects a list of {args[0].__name__}, got {value!r}") from None
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key} must be one of {', '.join(map(str, args))}, not {value!r}")
        return value
    if hint in (int, float) and isinstance(value, str):
        value = _number(hint, value)
    if hint is int and isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer():
        value = int(value)  # 1e5 and NumPy's integers, as whole numbers
    if hint is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
        if math.isnan(value):  # every comparison with it is false: no range check would catch it
            raise ConfigError(f"{key} must be a number, got nan")
        return float(value)
    if hint in (int, float, str, bool) and not isinstance(value, hint):
        article = "an" if hint.__name__[0] in "aeiou" else "a"
        raise ConfigError(f"{key} expects {article} {hint.__name__}, got {value!r}")
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce_item(kind: type, value: Any) -> Any:
    """One element of a list setting: whole numbers for ints (not 2.5 or true), as the field's type."""
    if isinstance(value, str) and kind in (int, float):
        value = _number(kind, value)
    if kind is int:
        value = int(value) if isinstance(value, float) and value.is_integer() else value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(value)
    value = kind(value)
    if kind is float and math.isnan(value):
        raise ValueError(value)
    return value


def _number(hint: type, text: str) -> Any:
    """A number YAML 1.1 left as text: ``5e-4`` and ``1e6`` (it needs ``5.0e-4``). Other text is
    returned as it is, for the type check to reject."""
    try:
        number = float(text)
    except ValueError:
        return text
    if hint is int:
        return int(number) if number.is_integer() else text
    return number


def merge(cls: type, base: dict[str, Any], updates: dict[str, Any], source: str) -> dict[str, Any]:
    """Return ``base`` updated with ``updates``, rejecting keys the config does not have."""
    names = field_names(cls)
    out = dict(base)
    for key, value in updates.items():
        key = key.replace("-", "_")
        if key not in names:
            close = difflib.get_close_matches(key, names, n=3)
            peer = peer_hint(cls, key) or owners_hint(cls, key)
            hint = f" ({peer})" if peer else f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"{source}: unknown setting {key!r}{hint}")
        try:
            out[key] = _coerce(cls, key, value)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None  # which file (or flag) holds the bad value
    return out


def parse_set(items: list[str], flag: str = "--set") -> dict[str, Any]:
    """Parse ``--set key=value`` items; values are read as YAML scalars (``1e-3``, ``true``, ``[64, 64]``)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} expects key=value, got {item!r}")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as e:
            raise ConfigError(f"{flag} {item}: the value is not valid YAML ({getattr(e, 'problem', None) or e}); "
                              f"quote a list as {flag} 'key=[64, 64]'") from None
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a config file: a flat mapping of field names to values."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                          f"{e.start}): give a YAML file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"config file {path} is not valid YAML: {getattr(e, 'problem', None) or e}{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping of settings")
    return data


def preset(algo: str, env: str) -> dict[str, Any]:
    """Tuned settings shipped for (algorithm, env), as in rl-baselines3-zoo; empty if none.

    A key may be a pattern (``ALE/*``: every Atari game), used when no key names the env itself."""
    path = resources.files("shoal") / "presets" / f"{algo}.yaml"
    if not path.is_file():
        return {}
    table = yaml.safe_load(path.read_text()) or {}
    if env not in table:
        env = next((key for key in table if fnmatch.fnmatchcase(env, key)), env)
    return dict(table.get(env, {}))


def preset_envs(algo: str) -> list[str]:
    """Env ids with a shipped preset for ``algo``."""
    path = resources.files("shoal") / "presets" / f"{algo}.yaml"
    return sorted((yaml.safe_load(path.read_text()) or {}).keys()) if path.is_file() else []


def preset_env(env: str) -> str:
    """The env id whose preset applies: remote://HOSTS/ENV_ID uses ENV_ID's."""
    if env.startswith("remote://"):
        return env.partition("://")[2].partition("/")[2] or env
    return env


def _check_encoder(path: str) -> None:
    """An ``--encoder`` names a class that imports: 'module:ClassName' (the forward pass is
    checked where the policy is built, on the env's observations)."""
    module, sep, name = path.partition(":")
    _check(bool(sep and module and name.isidentifier()), f"--encoder takes 'module:ClassName' (a torch.nn.Module "
           f"subclass in an importable module), got {path!r}")
    from shoal.policy import encoder_class

    encoder_class(path)


def _env_class_id(cls: type) -> str:
    """The env id of a ``gymnasium.Env`` subclass given as ``env`` (RLlib takes an env class): its
    import path, ``module:ClassName``, which every process (Ray workers, ``shoal eval``) imports
    and registers; or, for a class of a script or notebook (``__main__``) or one nested in
    another, its class name, registered here as ``gym.register`` in the script would (the run's
    Ray workers get such registrations through Ray's worker setup hook)."""
    import sys

    import gymnasium as gym

    if not issubclass(cls, gym.Env):
        raise ConfigError(f"env takes a Gymnasium env id, or a gymnasium.Env subclass; {cls.__qualname__} is not one")
    module = sys.modules.get(cls.__module__)
    if cls.__module__ != "__main__" and getattr(module, cls.__qualname__, None) is cls:
        return f"{cls.__module__}:{cls.__qualname__}"
    name = cls.__name__
    known = gym.registry.get(name)
    if known is not None and known.entry_point is not cls:
        raise ConfigError(f"env {cls.__qualname__}: the env id {name!r} is registered already, for "
                          f"{known.entry_point}; register your class under another id and give that")
    if known is None:
        gym.register(id=name, entry_point=cls)
    return name


def env_setting(value: str | list[str] | tuple[str, ...] | type) -> str:
    """One env setting from one id or several ``remote://`` URLs (``--env`` repeated, or a list
    in a config file): the URLs' servers together, ``remote://H1:P1,H2:P2[/ENV_ID]``."""
    if isinstance(value, str):
        return value
    if isinstance(value, type):
        return _env_class_id(value)
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"env takes a Gymnasium env id (a string: 'CartPole-v1', or 'my_module:MyEnv-v0' for an "
                          f"env my_module registers with gymnasium.register) or an env class, not an object of type "
                          f"{type(value).__name__}: every runner, evaluator and env server makes its own copies from "
                          "the id")
    urls = list(value)
    if len(urls) == 1 and isinstance(urls[0], str):
        return urls[0]
    if not urls or not all(isinstance(u, str) and u.startswith("remote://") for u in urls):
        raise ConfigError(f"env takes one env id, or several remote://HOST:PORT[/ENV_ID] servers; got {urls!r}")
    hosts, env_ids = [], set()
    for url in urls:
        host, _, env_id = url[len("remote://"):].partition("/")
        hosts.append(host)
        env_ids |= {env_id} if env_id else set()
    if len(env_ids) > 1:
        raise ConfigError(f"the env servers name different env ids ({', '.join(sorted(env_ids))}): "
                          "one run trains on one env")
    return "remote://" + ",".join(hosts) + ("/" + env_ids.pop() if env_ids else "")


def build(cls: type, algo: str, env: str | list[str] | None = None, file: str | None = None,
          sets: dict[str, Any] | None = None, sets_source: str = "--set") -> Any:
    """Layer defaults, preset, file and overrides into a validated config of type ``cls``."""
    values: dict[str, Any] = {}
    from_file = read_yaml(file) if file else {}
    file_algo = from_file.pop("algo", None)  # a run's config.yaml names its algorithm
    if file_algo is not None and file_algo != algo:
        raise ConfigError(f"config file {file} is for {file_algo} (its algo: key), not {algo}: train it with "
                          f"`shoal train {file_algo} --config {file}`, or delete that key to use its settings here")
    sets = dict(sets or {})
    given = env, sets.pop("env", None), from_file.pop("env", None)  # settled here, not merged below
    env = env_setting(next((e for e in given if e), cls.env))
    key = preset_env(env)
    values = merge(cls, values, preset(algo, key), f"preset {algo}/{key}")
    values = merge(cls, values, from_file, f"config file {file}")
    values = merge(cls, values, sets, sets_source)
    values["env"] = env
    return cls(**values)


def to_dict(config: Any) -> dict[str, Any]:
    """A plain, YAML-friendly dict of a config (tuples become lists)."""
    out = dataclasses.asdict(config)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
