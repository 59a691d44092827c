"""Policies: observation -> action, the part shipped to runners, evaluators and deployment.

The policy holds its observation normaliser, so weights, normaliser statistics and the action
rule travel together as one state dict. The learner (which owns optimisers) is separate.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn
from torch.distributions import Categorical, Distribution, Independent, Normal

from shoal import devices
from shoal.errors import ShoalError

Weights = dict[str, np.ndarray]


Memory = tuple[np.ndarray, np.ndarray]
"""A recurrent policy's memory held outside it: (h, c), [N, 2 * lstm_size] float32 each."""


class Moments(NamedTuple):
    """Count, mean and variance of a set of observations, mergeable across runners."""

    count: float
    mean: np.ndarray
    var: np.ndarray

    @staticmethod
    def of(x: np.ndarray) -> "Moments":
        """Moments of a batch ``x`` of shape [N, *obs_shape]."""
        x = x.astype(np.float64, copy=False)
        return Moments(float(len(x)), x.mean(axis=0), x.var(axis=0))


class RunningNorm(nn.Module):
    """Running mean/std of observations (buffers, so they are saved with the weights)."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.clip, self.eps = clip, eps

    def forward(self, obs: Tensor) -> Tensor:
        std = torch.sqrt(self.var + self.eps).to(obs.dtype)
        return ((obs - self.mean.to(obs.dtype)) / std).clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, m: Moments) -> None:
        """Merge a batch's moments (parallel variance formula, Chan et al. 1979). On the CPU in
        NumPy, on the buffers' memory: 37 us where torch's ops on these few numbers took 117 us,
        and the replay-based learners merge a rollout's every env step."""
        if m.count == 0:
            return
        if self.mean.device.type == "cpu":  # the buffers' memory as arrays
            mean, var, count = self.mean.numpy(), self.var.numpy(), self.count.numpy()
            b_mean, b_var = m.mean, m.var
        else:
            mean, var, count = self.mean, self.var, self.count
            b_mean, b_var = (devices.upload(x, self.mean.device) for x in (m.mean, m.var))
        total = count + m.count
        delta = b_mean - mean
        m2 = var * count + b_var * m.count + delta**2 * count * m.count / total
        mean += delta * m.count / total
        var[...] = m2 / total
        count[...] = total


def set_up_torch(threads: int) -> None:
    """Each role's torch settings: its intra-op threads, and denormal floats flushed to zero.

    Adam's second moments of small gradients decay into denormals, which the CPU handles in
    microcode: DQN on CartPole took 2.24 ms per update with them and 1.68 ms without
    (benchmarks/bench_denormals.py, BENCHMARKS.md). Values below 1.2e-38 becoming 0 changes no
    result that matters. The setting is per thread, and torch's intra-op threads inherit it when
    they are created, at the process's first parallel op: the driver and every role call this
    first thing, on the thread that runs their calls. (A process that ran parallel torch ops
    before keeps denormals in those threads: with 2 torch threads a DQN update cost 1.57 ms
    then, 1.16 ms with every thread flushing.)
    """
    torch.set_flush_denormal(True)
    torch.set_num_threads(threads)


def is_image(space: gym.Space) -> bool:
    """Whether observations of ``space`` are images: a uint8 Box of 2 or 3 dimensions (as
    stable-baselines3 decides). Policies with a convolutional encoder keep them uint8."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) in (2, 3)


def image_layout(shape: tuple[int, ...]) -> tuple[tuple[int, int, int], bool]:
    """The (channels, height, width) of images of ``shape``, and whether they arrive channels-last.

    A 2-D image is one channel. Of a 3-D one the smallest dimension is the channels: last for
    Gymnasium's HWC frames (CarRacing's 96x96x3), first for stacked frames (Atari's 4x84x84).
    """
    if len(shape) == 2:
        return (1, *shape), False
    last = int(np.argmin(shape)) == 2
    return ((shape[2], shape[0], shape[1]) if last else tuple(shape)), last  # type: ignore[return-value]


def network_input(obs_space: gym.Space) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of the network inputs made from observations of ``obs_space`` (what
    rollouts and replay hold): uint8 [C, H, W] images, or flat float32 vectors; for a Dict of
    images and vectors (a :class:`shoal.envs.MixedBox`) their bytes (:func:`pack_mixed`)."""
    if is_image(obs_space):
        return image_layout(obs_space.shape)[0], np.dtype(np.uint8)
    width = int(np.prod(obs_space.shape))
    if getattr(obs_space, "images", ()):
        return (obs_space.pixels + 4 * (width - obs_space.pixels),), np.dtype(np.uint8)
    return (width,), np.dtype(np.float32)


def pack_mixed(obs: Tensor, pixels: int) -> Tensor:
    """Flat float32 observations [N, D] of a :class:`shoal.envs.MixedBox` as bytes [N, pixels + 4
    (D - pixels)]: each pixel one byte, then the vector's float32s as they lie in memory. Replay
    holds a camera's frames in a quarter of the bytes; :class:`MixedEncoder` reads them back."""
    return torch.cat([obs[:, :pixels].to(torch.uint8), obs[:, pixels:].float().contiguous().view(torch.uint8)], 1)


class ConvEncoder(nn.Module):
    """uint8 images [N, C, H, W] -> features [N, out_dim], scaled to [0, 1] first.

    Images of 36 pixels a side or more get the Nature DQN network (Mnih et al. 2015: 32 8x8
    filters stride 4, 64 4x4 stride 2, 64 3x3 stride 1, then 512 units), which the Atari
    results of DQN, A2C, PPO and IMPALA were all reached with, and stable-baselines3 and RLlib
    use. Smaller ones (MiniGrid's 7x7, MinAtar's 10x10) would vanish under its strides: they get
    three 3x3 layers (32, 64 stride 2, 64 filters) and 256 units.
    """

    def __init__(self, chw: tuple[int, int, int]):
        super().__init__()
        c, h, w = chw
        # The Nature network's convolutions run channels-last (NHWC): a PPO minibatch of 256 Atari
        # stacks took 121-153 ms so against 168-200 ms in NCHW (forward, backward and Adam, 2
        # threads, BENCHMARKS.md). For 7x7 views the two were within noise: they stay NCHW.
        if min(h, w) >= 36:
            convs = [nn.Conv2d(c, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(), nn.Conv2d(64, 64, 3, 1)]
            self.out_dim, self.memory_format = 512, torch.channels_last
        else:
            convs = [nn.Conv2d(c, 32, 3, 1, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(),
                     nn.Conv2d(64, 64, 3, 1, 1)]
            self.out_dim, self.memory_format = 256, torch.contiguous_format
        self.convs = nn.Sequential(*convs, nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, c, h, w)).shape[1]
        self.linear = nn.Linear(flat, self.out_dim)
        for layer in [*self.convs, self.linear]:
            if isinstance(layer, (nn.Conv2d, nn.Linear)):  # as mlp() and the baselines: orthogonal, sqrt(2)
                nn.init.orthogonal_(layer.weight, math.sqrt(2))
                nn.init.zeros_(layer.bias)
        self.convs.to(memory_format=self.memory_format)

    def forward(self, x: Tensor) -> Tensor:
        x = x.contiguous(memory_format=self.memory_format).float() / 255.0
        return torch.relu(self.linear(self.convs(x)))


class MixedEncoder(nn.Module):
    """Observations of a Dict of images and vectors (a :class:`shoal.envs.MixedBox`) -> features
    [N, out_dim]: each image through a :class:`ConvEncoder` of its own, then the vector's entries
    as they are, side by side (stable-baselines3's CombinedExtractor, which its MultiInputPolicy
    uses). It takes the bytes rollouts and replay hold (:func:`pack_mixed`), or the flat float32
    observations themselves (what an ONNX export takes)."""

    def __init__(self, images: tuple[tuple[int, ...], ...], vector_dim: int):
        super().__init__()
        self.images, self.vector_dim = tuple(images), vector_dim
        self.layouts = [image_layout(shape) for shape in self.images]
        self.sizes = [math.prod(shape) for shape in self.images]
        self.pixels = sum(self.sizes)
        self.convs = nn.ModuleList(ConvEncoder(chw) for chw, _ in self.layouts)
        self.out_dim = sum(conv.out_dim for conv in self.convs) + vector_dim

    def fresh(self) -> MixedEncoder:
        """Another encoder of this layout, freshly initialised (the critics' own)."""
        return MixedEncoder(self.images, self.vector_dim)

    def forward(self, x: Tensor) -> Tensor:
        n, start, features = x.shape[0], 0, []
        for conv, shape, ((c, h, w), last), size in zip(self.convs, self.images, self.layouts, self.sizes):
            image = x[:, start:start + size].reshape(n, *shape)
            features.append(conv((image.permute(0, 3, 1, 2) if last else image).reshape(n, c, h, w)))
            start += size
        vector = x[:, self.pixels:]
        if x.dtype == torch.uint8:  # a copy of its own: a view's offset may not fall on a float's 4 bytes
            vector = vector.clone(memory_format=torch.contiguous_format).view(torch.float32)
        return torch.cat([*features, vector.float()], 1)


class EncoderSpec(NamedTuple):
    """A feature extractor of the user's in place of shoal's (``--encoder module:ClassName``, and
    ``--encoder-kwargs``), as stable-baselines3's ``features_extractor_class`` or an RLlib custom
    model: a ``torch.nn.Module`` subclass built as ``ClassName(input_space, **kwargs)``.

    ``input_space`` is a Box of what it reads, a batch at a time: flat float32 vectors [N, D] (the
    observation flattened, normalised with --normalize-obs, an action mask's entries after it), or
    images [N, C, H, W] as float32 scaled to [0, 1]. It returns features [N, K]; shoal finds K by
    calling it once on a batch of zeros, and puts the algorithm's MLP heads (``hidden_sizes``) on
    them. Every process that builds the policy (Ray workers, ``shoal eval``, the policy server)
    imports the module by name, as a ``module:EnvId`` env's.
    """

    path: str
    kwargs: dict[str, Any]

    @staticmethod
    def of(config: Any) -> EncoderSpec | None:
        path = getattr(config, "encoder", None)
        return EncoderSpec(path, dict(config.encoder_kwargs)) if path else None

    def build(self, input_shape: tuple[int, ...], image: bool) -> UserEncoder:
        """The user's module, with its feature width K (and images scaled to [0, 1] before it)."""
        cls, name = encoder_class(self.path), self.path.partition(":")[2]
        space = gym.spaces.Box(0.0 if image else -np.inf, 1.0 if image else np.inf, input_shape, np.float32)
        try:
            module = cls(space, **self.kwargs)
        except Exception as e:  # the user's constructor: any mistake it makes is theirs, in one line
            raise ShoalError(f"--encoder {self.path}: {name}(input_space, **{self.kwargs}) raised "
                             f"{type(e).__name__}: {e}") from None
        training = module.training
        module.eval()  # (batch norm's statistics stay as they were)
        try:
            with torch.no_grad():
                out = module(torch.zeros(2, *input_shape))
        except Exception as e:
            raise ShoalError(f"--encoder {self.path}: its forward pass on a batch of zeros {[2, *input_shape]} "
                             f"raised {type(e).__name__}: {e}") from None
        if not (isinstance(out, Tensor) and out.dim() == 2 and out.shape[0] == 2 and out.shape[1] >= 1
                and out.is_floating_point()):
            got = list(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ShoalError(f"--encoder {self.path}: it must return float features [N, K] for inputs "
                             f"{['N', *input_shape]}; it returned {got} for N = 2")
        module.train(training)
        return UserEncoder(module, int(out.shape[1]), image)


def encoder_class(path: str) -> type[nn.Module]:
    """The class an ``--encoder`` 'module:ClassName' names, its module imported (from the working
    directory too, as a ``module:EnvId`` env's)."""
    from shoal.envs import import_named

    return import_named(path, "--encoder", lambda found: isinstance(found, type) and issubclass(found, nn.Module),
                        "a torch.nn.Module subclass")


class UserEncoder(nn.Module):
    """The user's encoder (:class:`EncoderSpec`) and its feature width ``out_dim``; uint8 images
    are scaled to float32 in [0, 1] before it."""

    def __init__(self, module: nn.Module, out_dim: int, image: bool):
        super().__init__()
        self.module, self.out_dim, self.image = module, out_dim, image

    def forward(self, x: Tensor) -> Tensor:
        return self.module(x.float() / 255.0 if self.image else x)


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """``module`` in eval mode within the block (an --encoder's dropout off, its batch norm on the
    running statistics), then each of its layers in the mode it was in."""
    modes = [(layer, layer.training) for layer in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for layer, training in modes:
            layer.training = training


def mlp(sizes: list[int], activation: type[nn.Module], out_gain: float) -> nn.Sequential:
    """An MLP with orthogonal init (hidden gain sqrt(2), output ``out_gain``), as in PPO baselines."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        linear = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        nn.init.orthogonal_(linear.weight, out_gain if last else math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers += [linear] if last else [linear, activation()]
    return nn.Sequential(*layers)


class StateDependentNoise(nn.Module):
    """gSDE's exploration noise (generalized State-Dependent Exploration, Raffin et al. 2021, as
    stable-baselines3's ``use_sde`` with ``full_std``): for the actor's last hidden features h(s)
    [N, F], eps = h(s) theta, theta [F, A] drawn elementwise from N(0, sigma^2) with sigma =
    exp(log_std) learned; so, given the features, eps ~ N(0, sqrt(h^2 sigma^2)) per action.

    A runner's copy holds one theta per env for a rollout, or for ``sample_freq``
    steps, so an env's consecutive actions explore together instead of as white noise; a
    learner or a deployed policy draws one theta per call. ``learn_features``:
    whether the noise's gradient reaches the features (SB3: on for SAC, off for PPO and A2C).
    """

    def __init__(self, features: int, actions: int, log_std_init: float, sample_freq: int, learn_features: bool):
        super().__init__()
        self.log_std = nn.Parameter(torch.full((features, actions), float(log_std_init)))
        self.sample_freq, self.learn_features = sample_freq, learn_features
        self.matrices: Tensor | None = None  # [envs, F, A]: a runner's, held
        self.steps = 0  # steps acted with them

    def std(self, h: Tensor) -> Tensor:
        """The noise's standard deviation [N, A] for features ``h`` [N, F]."""
        return self._std(h if self.learn_features else h.detach(), self.log_std.exp())

    @staticmethod
    def _std(f: Tensor, sigma: Tensor) -> Tensor:
        return (f.pow(2) @ sigma.pow(2) + 1e-6).sqrt()

    def noise(self, h: Tensor, generator: torch.Generator | None, held: bool = False) -> tuple[Tensor, Tensor]:
        """Noise [N, A] for features ``h`` [N, F], and its standard deviation [N, A]: with one
        theta drawn for the batch, or (``held``) each row with its env's, drawn at a rollout's
        first step (:meth:`start_rollout`), every ``sample_freq`` steps, and when the number of
        envs changes."""
        f, sigma = (h if self.learn_features else h.detach()), self.log_std.exp()
        if not held:
            return f @ (sigma * torch.randn(sigma.shape, generator=generator, device=sigma.device)), self._std(f, sigma)
        n, freq = len(f), self.sample_freq
        if self.matrices is None or len(self.matrices) != n or (freq > 0 and self.steps > 0 and self.steps % freq == 0):
            self.matrices = sigma.detach() * torch.randn((n, *sigma.shape), generator=generator, device=sigma.device)
        self.steps += 1
        return torch.bmm(f[:, None, :], self.matrices).squeeze(1), self._std(f, sigma)

    def start_rollout(self) -> None:
        """A runner's rollout begins: the envs' next step draws new matrices."""
        self.matrices, self.steps = None, 0


class UnsupportedActions(ShoalError):
    """An action space that this kind of policy network cannot act in, though another can; the
    driver names the algorithm (:class:`shoal.algorithm.Algorithm`)."""

    def __init__(self, space: gym.Space, hint: str):
        super().__init__(f"action space {space} is not supported by this algorithm: {hint}")
        self.space, self.hint = space, hint


class UnsupportedMasks(ShoalError):
    """An env that gives an action mask, for a policy network that cannot take one."""

    def __init__(self) -> None:
        super().__init__("this algorithm does not take action masks (the env gives one): ppo, a2c, trpo, impala, "
                         "appo, dqn and sac (discrete actions) do")


class PolicyModule(nn.Module):
    """What runners, evaluators and deployment need of any policy network.

    Exploration settings (epsilon, action noise, "act at random" before learning starts) are
    buffers of the module, so the learner sets them and they travel with the published weights.

    Network inputs (what rollouts and replay hold, and :meth:`normalize` makes) are of shape
    ``input_shape`` and dtype ``input_dtype``: flat float32 vectors, or, for a policy built with
    ``images=True`` and image observations, uint8 [C, H, W] images (a quarter of the bytes), which
    ``encoder`` turns into features. Without an image the encoder is the identity (no weights),
    unless the user gives one of their own (``encoder``, an :class:`EncoderSpec`), for images or
    vectors alike; ``cnn`` says whether the encoder is shoal's convolutional one, whose 512 (or
    256) units some algorithms' heads take as their hidden layer.
    """

    multi_discrete = False
    """Whether this policy takes MultiDiscrete and MultiBinary action spaces (see ``nvec``)."""

    masks = False
    """Whether this policy takes action masks: observations of a :class:`shoal.envs.MaskedBox`,
    whose last ``mask_dim`` entries say which actions are legal (see :meth:`legal`)."""

    layers_after_cnn = True
    """Whether ``hidden_sizes`` and ``activation`` make layers after shoal's convolutional encoder
    (SAC's, TD3's and DDPG's MLPs do); False where linear heads read its features."""

    learner_normalizes = False
    """Whether rollouts and replay hold the observations before the normaliser, which the learner
    applies to each batch with the statistics of that update (:meth:`normalize_in_learner`)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, normalize_obs: bool = False,
                 images: bool = False, encoder: EncoderSpec | None = None):
        super().__init__()
        if not isinstance(obs_space, gym.spaces.Box):
            raise ShoalError(f"observation space {obs_space} is not supported: shoal trains on Box observations, "
                             "and on Discrete, MultiDiscrete, MultiBinary ones and Tuples or Dicts of those, "
                             "which it flattens into a Box")
        multi = isinstance(action_space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
        if multi and not self.multi_discrete:
            raise UnsupportedActions(action_space, "MultiDiscrete and MultiBinary actions train with ppo, a2c, "
                                     "trpo, impala or appo")
        if not (multi or isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box))):
            raise ShoalError(f"action space {action_space} is not supported: use Discrete, Box, MultiDiscrete or "
                             "MultiBinary")
        self.obs_space, self.action_space = obs_space, action_space
        self.obs_dim = int(np.prod(obs_space.shape))
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        # A MultiDiscrete (or MultiBinary: 2 values each) action is one categorical choice per
        # element, flattened: nvec [k] values each, the network's outputs their sum.
        self.nvec: np.ndarray | None = None
        if isinstance(action_space, gym.spaces.MultiBinary):
            self.nvec = np.full(int(np.prod(action_space.shape)), 2, np.int64)
        elif isinstance(action_space, gym.spaces.MultiDiscrete):
            self.nvec = action_space.nvec.reshape(-1).astype(np.int64)
        if self.discrete:
            self.action_dim = int(action_space.n)
        elif self.nvec is not None:
            self.action_dim = int(self.nvec.sum())
        else:
            self.action_dim = int(np.prod(action_space.shape))
        self.image = is_image(obs_space)
        # a Dict of images and vectors: the images' shapes (a MixedBox), read by a MixedEncoder
        self.mixed: tuple[tuple[int, ...], ...] = tuple(getattr(obs_space, "images", ()))
        self.input_shape, self.input_dtype = network_input(obs_space)
        # the dtype of the observations normalize() takes (what a deployed policy casts them to)
        self.raw_dtype = np.dtype(np.uint8) if self.image else np.dtype(np.float32)
        self.encoder: nn.Module = nn.Identity()
        self.feature_dim = self.obs_dim
        self.encoder_spec, self.cnn = encoder, False
        if self.image or self.mixed:
            if not images:
                raise ShoalError(f"this algorithm takes vector observations, not images ({obs_space}): image "
                                 "observations train with ppo, a2c, trpo, impala, appo, dqn, qrdqn, sac, tqc, td3 "
                                 "or ddpg (a convolutional encoder)")
            if normalize_obs and self.image:
                raise ShoalError("normalize_obs is for vector observations: images are scaled to [0, 1] by the network")
        if self.image:
            self.channels_last = image_layout(obs_space.shape)[1]
        if self.mixed and encoder is not None:
            raise ShoalError(f"--encoder {encoder.path}: observations that are a Dict of images and vectors "
                             f"({obs_space}) go through shoal's encoder, a convolutional one per image beside the "
                             "vector; your own encoder takes a Box")
        if encoder is not None:
            self.encoder = encoder.build(self.input_shape, self.image)
            self.feature_dim = self.encoder.out_dim
        elif self.image:
            self.encoder, self.cnn = ConvEncoder(self.input_shape), True
            self.feature_dim = self.encoder.out_dim
        elif self.mixed:
            self.encoder = MixedEncoder(self.mixed, self.obs_dim - obs_space.pixels)
            self.feature_dim = self.encoder.out_dim
        # over the flat vector the network takes (a stack of frames, any Box of 2+ dimensions), from
        # entry norm_from on: past the pixels of a Dict of images and vectors, which the network scales
        self.norm_from = obs_space.pixels if self.mixed else 0
        self.obs_norm = RunningNorm((self.obs_dim - self.norm_from,)) if normalize_obs else None
        # What env_actions adds, clips to and casts to, worked out once (not per env step); not in
        # the state dict: they follow from the action space a checkpoint records.
        self.env_dtype = torch.from_numpy(np.zeros(0, action_space.dtype)).dtype
        if self.nvec is not None:  # MultiBinary has no start: 0
            start = getattr(action_space, "start", np.zeros(action_space.shape, np.int64))
            self.register_buffer("action_start", torch.tensor(start), persistent=False)
        if not (self.discrete or self.nvec is not None):
            self.register_buffer("action_low", torch.tensor(action_space.low), persistent=False)
            self.register_buffer("action_high", torch.tensor(action_space.high), persistent=False)
        self.mask_dim = int(getattr(obs_space, "mask_dim", 0))
        if self.mask_dim:
            if not self.masks:
                raise UnsupportedMasks()
            if self.mask_dim != self.action_dim or not (self.discrete or self.nvec is not None):
                raise ShoalError(f"an action mask of {self.mask_dim} entries does not fit the action space "
                                 f"{action_space}")

    def fresh_encoder(self) -> nn.Module | None:
        """Another encoder of the kind this policy's is (shoal's convolutional one for images, a
        Dict's, or the user's ``--encoder``), freshly initialised: a critic's own. None where the
        policy reads vectors as they are."""
        if self.encoder_spec is not None:
            return self.encoder_spec.build(self.input_shape, self.image)
        if self.mixed:
            return self.encoder.fresh()  # type: ignore[operator]
        return ConvEncoder(self.input_shape) if self.cnn else None  # type: ignore[arg-type]

    def normalize(self, obs: Tensor) -> Tensor:
        """Raw observations [N, *obs_shape] -> network input [N, *input_shape]. An action mask
        stays as it is (0 or 1), after the normalised observation."""
        if self.image:
            if self.channels_last:
                obs = obs.permute(0, 3, 1, 2)
            return obs.reshape(obs.shape[0], *self.input_shape).to(torch.uint8).contiguous()
        obs = obs.reshape(obs.shape[0], math.prod(obs.shape[1:])).float()  # (not -1: a batch may be empty)
        if self.mixed:
            return pack_mixed(self.mixed_floats(obs), self.norm_from)
        if self.obs_norm is None:
            return obs
        return self._mask_as_given(self.obs_norm(obs), obs)

    def normalize_in_learner(self) -> PolicyModule:
        """Normalise vector observations by a running mean/std (``--normalize-obs`` of the
        replay-based algorithms), and return the module. Runners act on normalised observations,
        but rollouts and replay hold them as the env gave them (:meth:`inputs`), and the learner
        normalises each sampled batch with the statistics of the moment (:meth:`network_inputs`),
        as stable-baselines3's VecNormalize does for an off-policy algorithm: a transition stored
        early is not read with the statistics of its day forever after."""
        if self.image or self.mixed:
            raise ShoalError(f"--normalize-obs is for vector observations ({self.obs_space}): the network scales "
                             "images to [0, 1], and a Dict of images and vectors trains normalised with the "
                             "on-policy algorithms")
        self.obs_norm = RunningNorm((self.obs_dim,))
        self.learner_normalizes = True
        return self

    def inputs(self, obs: Tensor) -> Tensor:
        """Raw observations [N, *obs_shape] -> what rollouts and replay hold: the network input
        (:meth:`normalize`), or with :attr:`learner_normalizes` the flat vector before the normaliser."""
        if not self.learner_normalizes:
            return self.normalize(obs)
        return obs.reshape(obs.shape[0], math.prod(obs.shape[1:])).float()

    def network_inputs(self, x: Tensor) -> Tensor:
        """What rollouts and replay hold (:meth:`inputs`) -> what the networks take."""
        if not self.learner_normalizes:
            return x
        return self._mask_as_given(self.obs_norm(x), x)  # type: ignore[misc]

    def _mask_as_given(self, x: Tensor, obs: Tensor) -> Tensor:
        """Normalised entries ``x`` with the action mask (their last ``mask_dim``) as it is in ``obs``
        (0 or 1): the normaliser leaves it alone."""
        return torch.cat([x[:, :-self.mask_dim], obs[:, -self.mask_dim:]], 1) if self.mask_dim else x

    def mixed_floats(self, obs: Tensor) -> Tensor:
        """Flat observations [N, D] of a Dict of images and vectors as the network reads them, in
        floats: the pixels as they are, the vector normalised where the policy normalises (what
        :func:`pack_mixed` stores as bytes, and an ONNX export takes in)."""
        if self.obs_norm is None:
            return obs
        vector = obs[:, self.norm_from:]
        return torch.cat([obs[:, :self.norm_from], self._mask_as_given(self.obs_norm(vector), vector)], 1)

    def legal(self, x: Tensor) -> Tensor | None:
        """The legal actions [N, action_dim] (bool) of network inputs ``x``: the mask in their
        last entries; every action for a row whose mask allows none (the final state of an episode
        may, and no arithmetic should meet a row that is all -inf). None without a mask."""
        if not self.mask_dim:
            return None
        if x.dtype == torch.uint8:  # a Dict of images and vectors, as bytes (pack_mixed): the mask's float32s
            mask = x[:, -4 * self.mask_dim:].clone(memory_format=torch.contiguous_format).view(torch.float32)
        else:
            mask = x[:, -self.mask_dim:]
        legal = mask > 0.5
        return legal | ~legal.any(-1, keepdim=True)

    def explore(self, x: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """Behaviour actions [N, ...] for network inputs ``x`` and their log-probabilities [N]
        (zeros where the algorithm does not use them)."""
        raise NotImplementedError

    def act(self, x: Tensor, deterministic: bool, generator: torch.Generator | None = None) -> Tensor:
        """Evaluation/deployment actions for network inputs ``x``."""
        raise NotImplementedError

    recurrent = False
    """Whether the policy carries a memory from step to step of an episode (``lstm_size``)."""

    def reset_memory(self, n: int) -> None:
        """Start ``n`` fresh episodes on the acting path (:meth:`explore`, :meth:`act`): for a
        recurrent policy, a zero memory of ``n`` rows; others hold none."""

    def forget(self, done: np.ndarray) -> None:
        """Zero the memory of the rows [N] whose episode just ended (recurrent policies)."""

    def start_rollout(self) -> None:
        """A runner's rollout begins (noise held for a rollout is drawn afresh); default: nothing."""

    def apply_ladder(self, index: int, count: int) -> None:
        """Set this copy's exploration for runner ``index`` of ``count`` (Ape-X); default: unchanged."""

    def initial_priorities(self, obs: Tensor, actions: Tensor, rewards: Tensor, next_obs: Tensor,
                           discounts: Tensor) -> Tensor | None:
        """|TD error| [N] of new transitions by this copy's own estimate, for prioritised replay
        (Ape-X); None where the policy holds no value estimate (the buffer then uses its maximum)."""
        return None

    def to_env(self, actions: Tensor) -> np.ndarray:
        """Actions as the env takes them (:meth:`env_actions`), as a NumPy array."""
        return self.env_actions(actions).cpu().numpy()

    def env_actions(self, actions: Tensor) -> Tensor:
        """Actions [N, ...] of :meth:`act` or :meth:`explore` as the env takes them: a discrete
        action's index counted from its space's ``start`` (Discrete(3, start=-1) takes -1, 0, 1; a
        MultiDiscrete's each element from its own), in the space's shape and dtype, continuous
        ones clipped to the bounds. Tensor operations only, so an exported policy ends with them."""
        if self.discrete:
            return actions.long() + int(self.action_space.start)
        a = actions.reshape(actions.shape[0], *self.action_space.shape)
        if self.nvec is not None:  # [N, k] indices; a MultiDiscrete's own start per element, as for Discrete
            return (a + self.action_start).to(self.env_dtype)
        return torch.clamp(a, self.action_low, self.action_high).to(self.env_dtype)


class ActorCritic(PolicyModule):
    """Separate actor and critic MLPs; categorical or diagonal-Gaussian actions, or for a
    MultiDiscrete/MultiBinary space one categorical per element (independent given the state, as
    stable-baselines3's MultiCategoricalDistribution and RLlib's MultiCategorical).

    With image observations (``images=True``) the two share one convolutional encoder, and are
    linear heads on its features (as stable-baselines3's and RLlib's CNN policies). With the
    user's ``encoder`` they share that, and are MLPs on its features. The critic's hidden widths
    are ``critic_hidden_sizes`` where given, else the actor's ``hidden_sizes``. With
    ``share_encoder=False`` the critic has an encoder of its own (``critic_encoder``, of the same
    kind; SB3's ``share_features_extractor=False``): the value loss no longer trains the actor's
    features, and the acting path runs the actor's encoder only.

    With ``lstm_size`` > 0 the policy is recurrent: an LSTM between the encoder and each MLP (one
    for the actor, one for the critic, as sb3-contrib's RecurrentPPO by default: a shared one
    learned far slower on CartPoleNoVel-v1, its features pulled by the value loss) carries a
    memory through each episode. The acting path (:meth:`explore`, :meth:`act`) steps the memory
    it holds (``memory``: hidden and cell states [N, 2 * lstm_size], the actor's then the
    critic's; not saved with the weights); learners replay whole sequences with :meth:`unroll`
    from the memory the runner started them with.

    With ``sde`` (sample_freq) a Gaussian policy explores with gSDE (:class:`StateDependentNoise`
    on the actor's last hidden features, which its gradient does not train, as SB3's PPO and A2C):
    a = mu(s) + h(s) theta, so a ~ N(mu, sqrt(h^2 sigma^2)) given s; ``log_std_init`` is then
    sigma's. ``ortho_init=False`` keeps torch's default initialisation of every layer instead of
    the orthogonal one (SB3's ``ortho_init``; rl-zoo's gSDE settings turn it off).
    """

    multi_discrete = True
    masks = True
    layers_after_cnn = False

    def __init__(self, obs_space: gym.Space, action_space: gym.Space,
                 hidden_sizes: tuple[int, ...] = (64, 64), activation: str = "tanh",
                 normalize_obs: bool = False, log_std_init: float = 0.0, images: bool = False,
                 lstm_size: int = 0, sde: int | None = None, ortho_init: bool = True,
                 encoder: EncoderSpec | None = None, share_encoder: bool = True,
                 critic_hidden_sizes: tuple[int, ...] | None = None):
        super().__init__(obs_space, action_space, normalize_obs, images, encoder)
        self.critic_encoder = None if share_encoder else self.fresh_encoder()
        if not share_encoder and self.critic_encoder is None:
            raise ShoalError("--no-share-encoder gives the critic an encoder of its own, for image observations or "
                             "--encoder: vectors go as they are to the actor's and the critic's own MLPs already")
        act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
        gaussian = not self.discrete and self.nvec is None
        if sde is not None and not gaussian:
            raise UnsupportedActions(action_space, "--use-sde explores continuous actions: it takes Box actions")
        if gaussian and sde is None:
            self.log_std = nn.Parameter(torch.full((self.action_dim,), float(log_std_init)))
        hidden = () if self.cnn else hidden_sizes
        critic_hidden = () if self.cnn else hidden_sizes if critic_hidden_sizes is None else critic_hidden_sizes
        self.lstm_size = lstm_size
        self.lstm = nn.ModuleList([nn.LSTM(self.feature_dim, lstm_size) for _ in "ac"]) if lstm_size else None
        self.recurrent = self.lstm is not None
        self.memory: tuple[Tensor, Tensor] | None = None
        head_in = lstm_size or self.feature_dim
        self.actor = mlp([head_in, *hidden, self.action_dim], act, out_gain=0.01)
        self.critic = mlp([head_in, *critic_hidden, 1], act, out_gain=1.0)
        self.sde = (StateDependentNoise(self.actor[-1].in_features, self.action_dim, log_std_init, sde,
                                        learn_features=False) if sde is not None else None)
        if not ortho_init:  # (a user's --encoder keeps the initialisation its class gave it)
            yours = {id(layer) for e in (self.encoder, self.critic_encoder) if isinstance(e, UserEncoder)
                     for layer in e.modules()}
            for layer in self.modules():
                if isinstance(layer, (nn.Linear, nn.Conv2d)) and id(layer) not in yours:
                    layer.reset_parameters()
        if self.nvec is not None:
            # The actor's flat outputs [N, sum(nvec)] are laid out as [N, k, max(nvec)], the slots
            # past an element's own count filled with the smallest float (probability 0), so every
            # element's softmax, sample and log-probability is one batched op. Not saved: rebuilt
            # from the action space.
            width = int(self.nvec.max())
            offsets = np.concatenate([[0], np.cumsum(self.nvec)[:-1]])
            slot = np.arange(width)
            valid = slot[None, :] < self.nvec[:, None]
            self.register_buffer("_slots", torch.as_tensor(np.where(valid, offsets[:, None] + slot, 0).reshape(-1)),
                                 persistent=False)
            self.register_buffer("_padding", torch.as_tensor(~valid), persistent=False)

    def reset_memory(self, n: int) -> None:
        if self.lstm is not None:
            zeros = torch.zeros(n, 2 * self.lstm_size, device=self.lstm[0].weight_hh_l0.device)
            self.memory = (zeros, zeros.clone())

    def start_rollout(self) -> None:
        if self.sde is not None:
            self.sde.start_rollout()

    def forget(self, done: np.ndarray) -> None:
        if self.memory is not None and done.any():
            keep = torch.as_tensor(~done, dtype=torch.float32, device=self.memory[0].device)[:, None]
            self.memory = (self.memory[0] * keep, self.memory[1] * keep)

    def encode(self, x: Tensor) -> Tensor:
        """The encoders' features of network inputs ``x`` [N, ...]: the shared encoder's, or where
        the critic has an encoder of its own, the actor's then the critic's [N, 2 * feature_dim]."""
        h = self.encoder(x)
        return h if self.critic_encoder is None else torch.cat([h, self.critic_encoder(x)], -1)

    def features(self, x: Tensor) -> Tensor:
        """A recurrent policy's heads' input for network inputs ``x`` [N, ...] on the acting path:
        the LSTMs' output after one step of its memory (a fresh zero memory when it holds none for
        N rows). A feed-forward policy's heads read :meth:`encode` (:meth:`_actor_input`)."""
        h = self.encode(x)
        if self.memory is None or len(self.memory[0]) != len(h):
            self.reset_memory(len(h))
        self.memory = self._lstm_step(h, self.memory)
        return self.memory[0]

    def _lstm_input(self, f: Tensor, i: int) -> Tensor:
        """The features :meth:`encode` gave ``f`` [..., F] that LSTM ``i`` (0: the actor's, 1: the
        critic's) reads: all of them, or its own encoder's."""
        if self.critic_encoder is None:
            return f
        return f[..., i * self.feature_dim:(i + 1) * self.feature_dim]

    def _lstm_step(self, f: Tensor, memory: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """One step of the actor's and the critic's LSTMs on features ``f`` (:meth:`encode`'s): the
        LSTM cell op on their weights (a one-step call of nn.LSTM cost 2.4x as much here)."""
        n, (h, c) = self.lstm_size, memory
        out = [torch.lstm_cell(self._lstm_input(f, i), (h[:, i * n:(i + 1) * n], c[:, i * n:(i + 1) * n]),
                               lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0)
               for i, lstm in enumerate(self.lstm)]
        return torch.cat([out[0][0], out[1][0]], 1), torch.cat([out[0][1], out[1][1]], 1)

    def _split(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """The actor's and the critic's inputs in the heads' input ``h``."""
        if self.lstm is not None:
            return h[..., :self.lstm_size], h[..., self.lstm_size:]
        if self.critic_encoder is not None:
            return h[..., :self.feature_dim], h[..., self.feature_dim:]
        return h, h

    def _actor_input(self, x: Tensor) -> Tensor:
        """The actor's input on the acting path for network inputs ``x``: the actor's encoder's
        features (a critic's own encoder is not run), or a recurrent actor's LSTM output after one
        step of the memory (both LSTMs step: the critic's memory trains with the rollout)."""
        return self.encoder(x) if self.lstm is None else self._split(self.features(x))[0]

    def unroll(self, f: Tensor, segments: np.ndarray, memory: tuple[Tensor, Tensor]) -> Tensor:
        """The LSTMs' hidden states [M, 2 * lstm_size] after each of the M feature rows ``f``
        [M, F] (:meth:`encode`'s), stepped as the episode segments ``segments`` [L, S]
        lay them out (each column a segment's rows in order, -1 past its end) from ``memory``
        (h, c) [S, 2 * lstm_size]: what the acting path computed step by step, replayed with one
        fused nn.LSTM pass per network (4.7x faster than a loop of cells with backpropagation)."""
        n, (h, c) = self.lstm_size, memory
        x = torch.cat([f, f.new_zeros(1, f.shape[1])])[devices.upload(segments, f.device)]  # -1: the zero row
        start = lambda m, i: m[None, :, i * n:(i + 1) * n].contiguous()  # noqa: E731  (network i's part)
        out = torch.cat([lstm(self._lstm_input(x, i), (start(h, i), start(c, i)))[0]
                         for i, lstm in enumerate(self.lstm)], -1)
        out = out.flatten(0, 1)
        valid = segments.reshape(-1) >= 0
        where = np.empty(len(f), np.int64)
        where[segments.reshape(-1)[valid]] = np.flatnonzero(valid)
        return out[devices.upload(where, out.device)]

    def critic_value(self, h: Tensor) -> Tensor:
        """State values [...] from the heads' inputs ``h`` [..., width]."""
        return self.critic(self._split(h)[1]).squeeze(-1)

    def heads(self, h: Tensor, actions: Tensor, legal: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probability [N] and entropy [N] of ``actions``, and the state value [N], from the
        heads' inputs ``h`` [N, ...] (:meth:`features`, or :meth:`unroll`'s hidden states) and
        the legal actions (:meth:`legal` of the inputs; None: all)."""
        a, v = self._split(h)
        out, latent = self._actor(a)
        logp, entropy = self._logp_entropy(self._logits(out, legal), actions, latent)
        return logp, entropy, self.critic(v).squeeze(-1)

    def _actor(self, a: Tensor) -> tuple[Tensor, Tensor | None]:
        """The actor's outputs [N, action_dim] for its inputs ``a``, and with gSDE its last hidden
        features [N, F] (else None)."""
        if self.sde is None:
            return self.actor(a), None
        *hidden, head = self.actor  # (slicing the Sequential would build a new one each step: 11 us)
        latent = a
        for layer in hidden:
            latent = layer(latent)
        return head(latent), latent

    def _log_std(self, out: Tensor, latent: Tensor | None) -> Tensor:
        """A Gaussian's log standard deviations [N, A] for the means ``out``: the learned ones, or
        with gSDE the noise's for the features ``latent``."""
        return self.log_std.expand_as(out) if self.sde is None else self.sde.std(latent).log()

    def _logits(self, out: Tensor, legal: Tensor | None) -> Tensor:
        """The actor's outputs [N, action_dim] as logits: of a Discrete space as they are, of a
        MultiDiscrete one laid out per element [N, k, max(nvec)] (see ``_slots``). Illegal actions
        (``legal`` [N, action_dim], :meth:`legal`) and the slots past an element's own count get
        the smallest float: probability 0, and no gradient. A Gaussian's means stay as they are."""
        lowest = torch.finfo(out.dtype).min
        if self.nvec is not None:
            logits = out[:, self._slots].view(out.shape[0], *self._padding.shape)
            drop = self._padding if legal is None else self._padding | ~legal[:, self._slots].view(logits.shape)
            return logits.masked_fill(drop, lowest)
        return out if legal is None else out.masked_fill(~legal, lowest)

    def dist(self, x: Tensor) -> Distribution:
        """Action distribution for network inputs ``x`` [N, *input_shape]."""
        out, latent = self._actor(self._actor_input(x))
        out = self._logits(out, self.legal(x))
        if self.discrete:
            return Categorical(logits=out, validate_args=False)
        if self.nvec is not None:
            return Independent(Categorical(logits=out, validate_args=False), 1, validate_args=False)
        return Normal(out, self._log_std(out, latent).exp(), validate_args=False)

    def explore(self, x: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """Sample actions [N, ...] and their log-probabilities [N]: the runners' per-step path,
        without building a Distribution object; with gSDE the noise each env holds."""
        out, latent = self._actor(self._actor_input(x))
        out = self._logits(out, self.legal(x))
        if self.discrete:
            logp_all = torch.log_softmax(out, dim=-1)
            actions = torch.multinomial(logp_all.exp(), 1, generator=generator)
            return actions.squeeze(-1), logp_all.gather(-1, actions).squeeze(-1)
        if self.nvec is not None:
            logp_all = torch.log_softmax(out, dim=-1)
            actions = torch.multinomial(logp_all.exp().flatten(0, 1), 1, generator=generator).view(len(out), -1)
            return actions, logp_all.gather(-1, actions[..., None]).squeeze(-1).sum(-1)
        if self.sde is None:
            log_std, noise = self.log_std, torch.randn(out.shape, generator=generator, device=out.device)
            eps = log_std.exp() * noise
        else:
            eps, std = self.sde.noise(latent, generator, held=True)
            log_std, noise = std.log(), eps / std
        logp = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
        return out + eps, logp.sum(-1)

    def evaluate(self, x: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probability [N] and entropy [N] of ``actions``, and the state value [N]: the
        learners' step, with one pass of each encoder (feed-forward policies)."""
        return self.heads(self.encode(x), actions, self.legal(x))

    def evaluate_actions(self, x: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Log-probability [N] and entropy [N] of ``actions``."""
        out, latent = self._actor(self.encoder(x))
        return self._logp_entropy(self._logits(out, self.legal(x)), actions, latent)

    def _logp_entropy(self, out: Tensor, actions: Tensor, latent: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Log-probability and entropy [N] of ``actions`` under :meth:`_logits`' ``out`` (and
        gSDE's features ``latent``). The learner's hot path, written with plain tensor ops
        (log_softmax and gather), ~10% faster per step than Categorical."""
        if self.discrete:
            logp_all = torch.log_softmax(out, dim=-1)
            return logp_all.gather(-1, actions.long()[:, None]).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)
        if self.nvec is not None:  # the elements' log-probabilities and entropies add up
            logp_all = torch.log_softmax(out, dim=-1)
            logp = logp_all.gather(-1, actions.long()[..., None]).squeeze(-1).sum(-1)
            return logp, -(logp_all.exp() * logp_all).sum((-2, -1))
        log_std = self._log_std(out, latent)
        logp = -0.5 * ((actions - out) / log_std.exp()).pow(2) - log_std - 0.5 * math.log(2 * math.pi)
        return logp.sum(-1), (log_std + 0.5 * (1 + math.log(2 * math.pi))).sum(-1)

    def value(self, x: Tensor) -> Tensor:
        """State value [N] for network inputs ``x``."""
        encoder = self.encoder if self.critic_encoder is None else self.critic_encoder
        return self.critic(encoder(x)).squeeze(-1)

    def act(self, x: Tensor, deterministic: bool, generator: torch.Generator | None = None) -> Tensor:
        """The most likely action, or a sample (with an explicit generator, so runs are
        reproducible). No Distribution object is built: in a policy server answering one
        observation per request, Categorical's construction was a quarter of the time."""
        return self._choose(*self._actor(self._actor_input(x)), self.legal(x), deterministic, generator)

    def act_with_memory(self, x: Tensor, memory: tuple[Tensor, Tensor], deterministic: bool = True,
                        generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`act` for a recurrent policy whose memory is given and returned, not held: one
        step of the episodes whose LSTM state is ``memory`` (h, c) [N, 2 * lstm_size] (zeros when
        they start); the actions and the new h and c (an exported policy, the policy server)."""
        h, c = self._lstm_step(self.encode(x), memory)
        return self._choose(*self._actor(self._split(h)[0]), self.legal(x), deterministic, generator), h, c

    def _choose(self, out: Tensor, latent: Tensor | None, legal: Tensor | None, deterministic: bool,
                generator: torch.Generator | None) -> Tensor:
        """Actions from the actor's outputs ``out`` (and gSDE's features ``latent``) and the legal
        actions: the most likely or a sample (with gSDE, of one noise matrix for the batch)."""
        out = self._logits(out, legal)
        if self.nvec is not None:
            logits = out
            if deterministic:
                return logits.argmax(-1)
            return torch.multinomial(torch.softmax(logits, dim=-1).flatten(0, 1), 1,
                                     generator=generator).view(len(out), -1)
        if deterministic:
            return out.argmax(-1) if self.discrete else out
        if self.discrete:
            return torch.multinomial(torch.softmax(out, dim=-1), 1, generator=generator).squeeze(-1)
        if self.sde is not None:
            return out + self.sde.noise(latent, generator)[0]
        return out + self.log_std.exp() * torch.randn(out.shape, generator=generator, device=out.device)


def get_weights(module: nn.Module) -> Weights:
    """A module's state as NumPy arrays: what the WeightStore publishes.

    From a device, each dtype's tensors come to the host in one copy, into page-locked memory on
    CUDA: a learner publishes every iteration, and a copy per tensor made the host wait for the
    GPU a dozen times (on an H200, DQN's Nature CNN took ~8 ms to publish, a quarter of its
    Breakout iteration). The arrays are views of those copies."""
    state = {k: v.detach() for k, v in module.state_dict().items()}
    if all(v.device.type == "cpu" for v in state.values()):
        return {k: v.numpy().copy() for k, v in state.items()}
    groups: dict[torch.dtype, list[str]] = {}
    for k, v in state.items():
        groups.setdefault(v.dtype, []).append(k)
    out = {}
    for keys in groups.values():
        flat = torch.cat([state[k].reshape(-1) for k in keys])
        host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=flat.is_cuda)
        parts = np.split(host.copy_(flat).numpy(), np.cumsum([state[k].numel() for k in keys])[:-1])
        for k, part in zip(keys, parts):
            out[k] = part.reshape(state[k].shape)
    return {k: out[k] for k in state}


def set_weights(module: nn.Module, weights: Weights) -> None:
    """Load published weights into ``module`` (copies, so read-only shared arrays are fine).

    When the names and shapes match a CPU module's, each array is copied once into the
    module's own tensor: runners of SAC, TD3 and DDPG load weights after every update, and
    load_state_dict (a tensor per array, then a copy, then its checks) took 3x as long.
    Anything else goes through load_state_dict, which names the keys that differ.
    """
    own = module.state_dict()
    if own.keys() == weights.keys() and all(
            t.device.type == "cpu" and tuple(t.shape) == np.shape(weights[k]) for k, t in own.items()):
        for k, t in own.items():
            np.copyto(t.numpy(), weights[k])
        return
    module.load_state_dict({k: torch.tensor(v) for k, v in weights.items()})


def non_finite_rows(x: np.ndarray) -> np.ndarray:
    """Indices of the rows of a batch ``x`` [N, ...] holding NaN or inf."""
    return np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))


def _non_finite(obs: np.ndarray, single: bool) -> str:
    """What :meth:`Policy.act` says of observations holding NaN or inf, naming the rows and values."""
    rows = non_finite_rows(obs[None] if single else obs)
    *others, last = sorted({str(v) for v in obs[~np.isfinite(obs)].tolist()})  # "-inf", "inf", "nan"
    values = f"{', '.join(others)} and {last}" if others else last
    where = "the observation" if single else (
        f"observation{'s' if len(rows) > 1 else ''} {', '.join(map(str, rows[:5]))}{', ...' if len(rows) > 5 else ''} "
        f"of {len(obs)}")
    return (f"{where} hold{'s' if single or len(rows) == 1 else ''} {values}: a policy gives no action for an "
            "observation that is not finite (the policy server refuses one too)")


def _dtype_kind(obs: Any) -> str:
    """The numpy dtype kind of ``obs`` as an array ("O" for anything ragged)."""
    try:
        return np.asarray(obs).dtype.kind
    except ValueError:
        return "O"


ONE_HOT_SPACES = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
"""Observation spaces shoal one-hots whose integers a deployed policy takes in one array."""


def _structured(obs: Any) -> bool:
    """Whether ``obs`` is a Dict or Tuple observation, or a list of them, rather than numbers."""
    return isinstance(obs, (dict, tuple)) or (isinstance(obs, list) and bool(obs) and isinstance(obs[0], (dict, tuple)))


def one_hot(space: gym.Space, obs: Any, flat_shape: tuple[int, ...]) -> Any:
    """Integer observations of a Discrete, MultiDiscrete (one axis) or MultiBinary space, one or a
    batch, as gymnasium's ``flatten`` lays them out (a one-hot vector per discrete part), in one
    NumPy op; ``obs`` unchanged if its shape is not the space's. For a Discrete space, rows that
    are one-hot already (gymnasium's flatten gives integers) stay as they are."""
    x = np.asarray(obs, dtype=np.int64)
    if isinstance(space, gym.spaces.Discrete):
        if x.shape[-1:] == flat_shape and x.ndim <= 2 and np.isin(x, (0, 1)).all() and np.all(x.sum(-1) == 1):
            return obs
        rel, n, lead = x - int(space.start), np.asarray(space.n), x.shape
    elif isinstance(space, gym.spaces.MultiBinary):
        k = len(space.shape)
        if x.shape[x.ndim - k:] != space.shape or x.ndim < k:
            return obs
        if not np.isin(x, (0, 1)).all():
            raise ShoalError(f"observation values in the env's observation space {space} are 0 or 1, got "
                             f"{int(x[~np.isin(x, (0, 1))].flat[0])}")
        return x.reshape(*x.shape[:x.ndim - k], -1).astype(np.float32)
    elif space.nvec.ndim == 1 and x.shape[-1:] == space.nvec.shape:
        rel, n, lead = x - space.start, space.nvec, x.shape[:-1]
    else:
        return obs
    bad = (rel < 0) | (rel >= n)
    if bad.any():
        what = "observation" if isinstance(space, gym.spaces.Discrete) else "observation element"
        raise ShoalError(f"{what} {int(x[bad].flat[0]) if x.ndim else int(x)} is not in the env's observation "
                         f"space {space}")
    if isinstance(space, gym.spaces.Discrete):
        return np.eye(int(space.n), dtype=np.float32)[rel]
    out = np.zeros((*lead, int(n.sum())), np.float32)
    np.put_along_axis(out, rel + np.concatenate([[0], np.cumsum(n)[:-1]]), 1.0, axis=-1)
    return out


class Policy:
    """A trained policy for deployment: ``policy.act(obs)`` returns actions the env accepts."""

    def __init__(self, module: PolicyModule, version: int = 0, config: Any = None,
                 env_observation_space: gym.Space | None = None):
        self.module = module.eval()
        self.version = version
        self.config = config  # the run's settings, when known (a checkpoint's, a live algorithm's)
        self.observation_space = module.obs_space
        self.action_space = module.action_space
        # The env's own observation space, as the checkpoint recorded it (Discrete, MultiDiscrete,
        # MultiBinary ones that shoal one-hots); None when it recorded none.
        self.saved_env_observation_space = env_observation_space

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = True,
            generator: torch.Generator | None = None, action_mask: np.ndarray | None = None) -> np.ndarray:
        """Actions for one observation or a batch [N, *obs_shape]. An env whose observations shoal
        flattens (Discrete, Tuple, Dict: FrozenLake's int, Blackjack's tuple) may be given them as
        the env returns them, one or a list. For a Discrete one, integers are states (a batch of 16
        FrozenLake states is 16 observations, not one flat vector), unless they are one-hot rows.

        A recurrent policy (``lstm_size``) remembers: each call is the next step of the episodes
        it acts in, one per row. Call :meth:`reset` when episodes start (a call with another
        number of rows starts them all afresh).

        A policy trained with an action mask (the env gave one) acts among the legal actions:
        those the observation's ``action_mask`` entry allows (a Dict observation as the env
        returns it), or ``action_mask`` [N, actions] or [actions] (1 legal, 0 not; as
        sb3-contrib's ``predict(obs, action_masks=...)``), given with the observation alone or
        with the flat vector runners see (the observation, then the mask; ``action_mask`` then
        replaces its mask). An observation alone without ``action_mask`` allows every action.

        An empty batch gets no actions (an array of 0 rows). An observation holding NaN or inf
        gets none either: a ShoalError names its row."""
        x, single = self._inputs(obs, action_mask)
        if not len(x):  # an empty batch: no actions (and a recurrent policy's memory as it was)
            return np.zeros((0, *self.action_space.shape), self.action_space.dtype)
        actions = self.module.to_env(self.module.act(x, deterministic, generator))
        return actions[0] if single else actions

    @torch.no_grad()
    def act_with_memory(self, obs: np.ndarray, memory: Memory | None, deterministic: bool = True,
                        generator: torch.Generator | None = None,
                        action_mask: np.ndarray | None = None) -> tuple[np.ndarray, Memory]:
        """:meth:`act` for a recurrent policy, its memory held by the caller, not the policy: one
        step of the episodes whose LSTM state is ``memory`` (h, c), each [N, 2 * lstm_size] ([2 *
        lstm_size] for one observation; None, or rows of zeros, for episodes that start). Returns
        the actions and the memory after them, for the episodes' next step. What the policy server
        does for its clients, and what a caller stepping many independent episodes may do."""
        if not self.module.recurrent:
            raise ShoalError("this policy is feed-forward: it holds no memory (use act)")
        x, single = self._inputs(obs, action_mask)
        width = 2 * self.module.lstm_size
        if memory is None:
            memory = (np.zeros((len(x), width), np.float32),) * 2
        hc = [np.asarray(m, np.float32) for m in memory]
        if any(m.shape != ((width,) if single else (len(x), width)) for m in hc):
            raise ShoalError(f"memory of shapes {[m.shape for m in hc]} for {len(x)} observation(s): this policy "
                             f"takes h and c of {width} numbers per observation (2 x lstm_size)")
        h, c = (devices.upload(m.reshape(len(x), width), self.device) for m in hc)
        actions, h, c = self.module.act_with_memory(x, (h, c), deterministic, generator)
        actions, h, c = self.module.to_env(actions), h.cpu().numpy(), c.cpu().numpy()
        return (actions[0], (h[0], c[0])) if single else (actions, (h, c))

    def _inputs(self, obs: Any, action_mask: np.ndarray | None) -> tuple[Tensor, bool]:
        """Network inputs [N, ...] of one observation or a batch (see :meth:`act`), and whether it was one."""
        obs = self.flat_observations(obs)
        shape = self.observation_space.shape
        if _structured(obs):
            raise ShoalError(self._not_flattened(obs))
        obs = np.asarray(obs, dtype=self.module.raw_dtype)
        if self.module.mask_dim:
            obs = self._with_mask(obs, action_mask)
        elif action_mask is not None:
            raise ShoalError("this policy takes no action mask: its env gave none when it was trained")
        single = obs.shape == shape
        if not single and obs.shape[1:] != shape:
            stack = getattr(self.config, "frame_stack", None) or 1
            hint = (f" (stacks of the last {stack} observations, as its run's frame_stack made them: "
                    "policy.make_env() gives its env stacking them)" if stack > 1 else "")
            raise ShoalError(f"observations of shape {obs.shape}: this policy takes one of shape {shape}{hint} "
                             f"or a batch of shape (N, {', '.join(map(str, shape))})")
        if obs.dtype.kind == "f" and not np.isfinite(obs).all():
            raise ShoalError(_non_finite(obs, single))
        return self.module.normalize(devices.upload(obs[None] if single else obs, self.device)), single

    def use_env_observation_space(self, space: gym.Space) -> None:
        """Take the env's own observations of ``space`` in :meth:`act` from now on, where the
        checkpoint recorded none (see :func:`shoal.load_policy`). A space whose observations do not
        flatten to this policy's input is refused."""
        shape, k = self.observation_space.shape, self.module.mask_dim
        before, self.saved_env_observation_space = self.saved_env_observation_space, space
        try:
            flat = self.flat_observations(space.sample())
            fits = not _structured(flat) and np.shape(flat) in (shape, (shape[0] - k,) if k else shape)
        except Exception:  # a space shoal cannot flatten at all  # noqa: BLE001
            fits = False
        if not fits:
            self.saved_env_observation_space = before
            raise ShoalError(f"the env's observations of {space} do not make this policy's input "
                             f"({self.observation_space}): is it the env the run trained on?")

    def _not_flattened(self, obs: Any) -> str:
        """Why a Dict or Tuple observation could not become the network's flat vector."""
        what = f"a {type(obs[0] if isinstance(obs, list) else obs).__name__} observation"
        shape = self.observation_space.shape
        width = f"flat vectors of {shape[0]} numbers" if shape else "arrays"
        raw = self.env_observation_space
        if raw is not None:
            return (f"{what} that is not one of the env's own ({raw}): this policy takes those, "
                    f"or {width} ({self.observation_space})")
        from shoal.envs import is_remote

        env = getattr(self.config, "env", None)
        why = ("its run trained on remote envs, which send the flat vectors" if env is not None and is_remote(env)
               else "its checkpoint recorded no observation space of the env's own")
        return (f"{what}: this policy takes {width} ({self.observation_space}), as {why}; give "
                "shoal.load_policy(..., env_observation_space=env.observation_space) to act on the env's own")

    def _with_mask(self, obs: np.ndarray, action_mask: np.ndarray | None) -> np.ndarray:
        """Observations [N, width] or [width] with their mask in the last entries (see :meth:`act`)."""
        k, width = self.module.mask_dim, self.observation_space.shape[0]
        alone = obs.shape[-1:] == (width - k,)
        if action_mask is None:
            return np.concatenate([obs, np.ones((*obs.shape[:-1], k), obs.dtype)], -1) if alone else obs
        try:
            mask = np.broadcast_to(np.asarray(action_mask, obs.dtype), (*obs.shape[:-1], k))
        except ValueError:
            raise ShoalError(f"an action_mask of shape {np.shape(action_mask)} for observations of shape {obs.shape}: "
                             f"this policy takes {k} entries per observation, one per action") from None
        if alone:
            return np.concatenate([obs, mask], -1)
        if obs.shape[-1:] == (width,):
            obs = obs.copy()
            obs[..., -k:] = mask
        return obs

    def make_env(self, render_mode: str | None = None) -> gym.Env:
        """One env of the run this policy was trained in, as the run made it: its env_kwargs, its
        frame stack and where its action mask comes from, so that its observations go to
        :meth:`act` as they are (a policy trained on stacked frames takes stacks)."""
        from shoal.envs import EnvOptions, make_env

        env = getattr(self.config, "env", None)
        if env is None:
            raise ShoalError("this policy does not know the env it was trained in (no run settings)")
        return make_env(env, render_mode, getattr(self.config, "env_kwargs", None), EnvOptions.of(self.config))

    def to(self, device: str | torch.device) -> Policy:
        """This policy, acting on ``device`` (``cuda``, ``cpu``; as ``--device`` names them) from
        now on: observations go there and actions come back as NumPy arrays. Returns itself."""
        from shoal import devices

        self.module.to(devices.resolve(str(device)))
        return self

    @property
    def device(self) -> torch.device:
        """Where this policy acts: its module's device (see :meth:`to`)."""
        return next(self.module.parameters()).device

    def export_onnx(self, path: str | Path) -> dict[str, Any]:
        """Write this policy's most likely actions as an ONNX model at ``path``, checked against
        :meth:`act` with ONNX Runtime first (see :mod:`shoal.export`; the ``export`` extra)."""
        from shoal.export import export_onnx

        return export_onnx(self, path)

    def reset(self, done: np.ndarray | None = None) -> None:
        """Forget a recurrent policy's memory: of every row, or of the rows where ``done`` [N] is
        True (the envs whose episode just ended). Nothing to do for a feed-forward policy."""
        if done is None:
            if self.module.recurrent:
                self.module.memory = None
        else:
            self.module.forget(np.asarray(done, bool).reshape(-1))

    @property
    def env_observation_space(self) -> gym.Space | None:
        """The space of the env's own observations when shoal flattens them for the network
        (FrozenLake's Discrete, Blackjack's Tuple): :meth:`act` takes those too. None for any
        other env, or where the env is not installed (the policy then takes flat vectors only).
        The checkpoint's record, or the space given to :meth:`use_env_observation_space`, when
        there is one; else the env is made here once to find out (not a remote env)."""
        from shoal.envs import EnvOptions, all_spaces, is_remote

        if self.saved_env_observation_space is not None:
            return self.saved_env_observation_space
        if not hasattr(self, "_env_space"):
            env = getattr(self.config, "env", None)
            self._env_space = None
            if env is not None and not is_remote(env) and not self.module.image:
                try:
                    self._env_space = all_spaces(env, getattr(self.config, "env_kwargs", None),
                                                  EnvOptions.of(self.config))[2]
                except Exception:  # the env (or a package it needs) is not installed where the policy is deployed
                    pass
        return self._env_space

    def flat_observations(self, obs: Any) -> Any:
        """``obs`` as the network's flat vector(s) when it holds the env's own observation(s) (see
        :attr:`env_observation_space`); anything else unchanged, for the caller's shape check."""
        shape, k = self.observation_space.shape, self.module.mask_dim
        own = (shape[0] - k,) if k else shape  # the observation's flat width, without its action mask
        integers = isinstance(obs, (int, np.integer, np.ndarray, list)) and _dtype_kind(obs) in "iu"
        if np.shape(obs)[-len(shape):] in (shape, own) and not isinstance(obs, (dict, tuple)) and not integers:
            return obs
        raw = self.env_observation_space
        if raw is None:
            return obs
        if integers and isinstance(raw, ONE_HOT_SPACES):
            return one_hot(raw, obs, own)
        flat = lambda o: gym.spaces.flatten(raw, o)  # noqa: E731
        if k and isinstance(raw, gym.spaces.Dict) and "action_mask" in raw.spaces:
            from shoal.envs import flatten_masked, mask_layout, rest_flattener

            rest_space, rest_keys = mask_layout(raw)
            flatten_rest = rest_flattener(rest_space)
            flat = lambda o: flatten_masked(flatten_rest, rest_keys, o)  # noqa: E731
        elif self.module.mixed:
            from shoal.envs import flatten_mixed, mixed_layout

            mixed = mixed_layout(raw)
            flat = lambda o: flatten_mixed(mixed, o)  # noqa: E731
        try:
            if raw.contains(obs):
                return flat(obs)
            if isinstance(obs, (list, np.ndarray)) and len(obs) and all(raw.contains(o) for o in obs):
                return np.stack([flat(o) for o in obs])
        except (TypeError, ValueError, AttributeError):
            pass
        return obs
