"""Environments: Gymnasium vector envs with same-step autoreset, env-id checks, space descriptions."""

from __future__ import annotations

import contextlib
import difflib
import importlib
import io
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import shoal.goals  # noqa: F401  (registers BitFlipping-v0)
import shoal.pixels  # noqa: F401  (registers PixelReach-v0)
import shoal.pomdp  # noqa: F401  (registers CartPoleNoVel-v1 and the other velocity-free envs)
from shoal.errors import ConfigError, ShoalError


# Env families shoal knows by their ids' prefix: the package that registers them (Gymnasium 1.x
# no longer imports env packages itself), and the extra that installs it.
ENV_PACKAGES = {"ALE/": ("ale_py", "atari"), "MiniGrid-": ("minigrid", "minigrid"), "BabyAI-": ("minigrid", "minigrid"),
                **{prefix: ("gymnasium_robotics", "robotics") for prefix in (
                    "Fetch", "HandReach", "HandManipulate", "PointMaze_", "AntMaze_", "AdroitHand", "FrankaKitchen")}}


def _import_env_package(env_id: str) -> None:
    """Import the package of a known env family, so that it registers its envs."""
    for prefix, (module, extra) in ENV_PACKAGES.items():
        if env_id.startswith(prefix):
            # gymnasium_robotics prints a notice about envs shoal does not use on every import
            quiet = contextlib.redirect_stderr(io.StringIO()) if module == "gymnasium_robotics" else contextlib.nullcontext()
            try:
                with quiet:
                    package = importlib.import_module(module)
            except ImportError:
                raise ShoalError(f"unknown environment {env_id!r}: its envs need the {module} package "
                                 f"(`pip install 'shoal[{extra}]'`)") from None
            if module == "ale_py":  # not its banner for every env made
                package.ALEInterface.setLoggerMode(package.LoggerMode.Error)


def import_env_packages() -> None:
    """Import every known env family's package that is installed (to list their envs)."""
    for prefix in ENV_PACKAGES:
        try:
            _import_env_package(prefix)
        except ShoalError:
            pass  # not installed


def import_user_module(module: str) -> None:
    """Import a module the user names: a ``module:EnvId`` env's, or ``--encoder``'s. A module in
    the working directory is found as ``python -m`` finds it (the ``shoal`` script's own directory
    is what Python searches first), and the directory is added to PYTHONPATH, for the Ray workers
    this process starts."""
    try:
        importlib.import_module(module)
        return
    except ImportError as e:
        top = module.partition(".")[0]
        cwd = os.getcwd()
        if e.name != top or cwd in sys.path or not any(
                os.path.exists(os.path.join(cwd, top + suffix)) for suffix in (".py", os.sep + "__init__.py")):
            raise
    sys.path.insert(0, cwd)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH")) if p)
    importlib.import_module(module)


def _register_env_class(module: str, name: str) -> None:
    """``module:ClassName`` naming a ``gymnasium.Env`` subclass that no registration names (RLlib
    takes an env class or its import path, as Gymnasium's ``entry_point`` does): register it under
    its class name, as ``gym.register(name, entry_point="module:ClassName")`` would. Every process
    that makes the env (a Ray worker, ``shoal eval``) comes here with the same id, and does the same."""
    found = getattr(sys.modules[module], name, None)
    if name not in gym.registry and isinstance(found, type) and issubclass(found, gym.Env):
        gym.register(id=name, entry_point=f"{module}:{name}")


def check_env_id(env_id: str) -> None:
    """Raise a clear error for an env id Gymnasium does not know, with the closest known ids.

    ``module:EnvId`` (Gymnasium's form for custom envs) imports ``module`` first, which registers it
    (or holds a ``gymnasium.Env`` subclass of that name: :func:`_register_env_class`); Atari's
    (``ALE/...``) and MiniGrid's ids import their package.
    """
    module, sep, name = env_id.rpartition(":")
    if sep:
        try:
            import_user_module(module)
        except ImportError as e:
            raise ShoalError(f"cannot import {module!r} for environment {env_id!r}: {e}") from None
        env_id = name
        _register_env_class(module, name)
    if env_id in gym.registry:
        return
    _import_env_package(env_id)
    import_env_packages()  # and those without a prefix (Atari's older ids: PongNoFrameskip-v4)
    if env_id in gym.registry:
        return
    namespace = env_id.partition("/")[0] if "/" in env_id else None
    if namespace and not any(spec.namespace == namespace for spec in gym.registry.values()):
        how = f"install the package that provides it, then --env MODULE:{env_id} to import it first"
        raise ShoalError(f"unknown environment {env_id!r}: no installed package registers the namespace "
                         f"{namespace!r} ({how})")
    close = close_env_ids(env_id)
    hint = f"; did you mean {', '.join(close)}?" if close else "; `shoal envs` lists them"
    raise ShoalError(f"unknown environment {env_id!r}{hint}")


def close_env_ids(env_id: str, n: int = 3) -> list[str]:
    """Registered ids whose names (without "-vN", in any case) are close to ``env_id``'s, the
    newest version of each first. Whole ids compared shared "-v0" too well: 'NoSuchEnv-v0' came
    out as UpNDown-v0, and 'Taxi-v3' as Humanoid-v3 beside Taxi-v4."""
    def name_and_version(i: str) -> tuple[str, int]:
        name, sep, tail = i.rpartition("-v")
        return (name.lower(), int(tail)) if sep and tail.isdigit() else (i.lower(), -1)

    by_name: dict[str, list[str]] = {}
    for i in gym.registry:
        by_name.setdefault(name_and_version(i)[0], []).append(i)
    names = difflib.get_close_matches(name_and_version(env_id)[0], list(by_name), n=n, cutoff=0.6)
    return [i for name in names for i in sorted(by_name[name], key=lambda i: name_and_version(i)[1], reverse=True)][:n]


# Registrations that every process makes by itself: Gymnasium's own (on import) and those of the
# env packages shoal imports for their ids' prefixes.
SELF_REGISTERED = ("gymnasium.", "ale_py", "minigrid", "gymnasium_robotics", "shoal.")


def registered_here(env_id: str) -> Any:
    """The EnvSpec of ``env_id`` if this process registered it itself (a ``gym.register`` in a
    script or a notebook): other processes (Ray workers) do not know the id. None for ids every
    process knows, ``module:EnvId`` ids (each process imports the module) and env servers."""
    if is_remote(env_id) or ":" in env_id:
        return None
    spec = gym.registry.get(env_id)
    if spec is None or (isinstance(spec.entry_point, str) and spec.entry_point.startswith(SELF_REGISTERED)):
        return None
    return spec


def register_spec(spec: Any) -> None:
    """Register an EnvSpec from another process (a Ray worker's setup hook), unless known here."""
    if spec.id not in gym.registry:
        gym.registry[spec.id] = spec


def callable_path(obj: Any, what: str, example: str) -> str:
    """``module:Name`` of a class or function given in Python (an encoder, an env wrapper): every
    process that uses it (Ray workers, ``shoal eval``, the policy server) imports it by that path,
    so it must live in a module, not in a script run as ``__main__`` or inside a function."""
    module = sys.modules.get(obj.__module__)
    if obj.__module__ == "__main__" or getattr(module, obj.__qualname__, None) is not obj:
        raise ConfigError(f"{what} {obj.__qualname__}: put it in a module of its own ({example}) and import it from "
                          "there: runners, evaluators and `shoal eval` import it by 'module:Name', and a script's "
                          "classes and functions cannot be imported that way")
    return f"{obj.__module__}:{obj.__qualname__}"


def wrapper_specs(value: Any) -> list[Any]:
    """``env_wrappers`` in the form a config keeps (rl-zoo's ``env_wrapper``): a list whose items are
    'module:Name' or a one-entry mapping {'module:Name': {keyword arguments}}. It takes one item
    or a list of them; an item may also be rl-zoo's dotted 'package.module.Name', a class or function
    (from Python), or a (name, kwargs) pair. Each name must import as a callable."""
    items = list(value) if isinstance(value, list) else [value]
    specs: list[Any] = []
    for item in items:
        kwargs: Any = {}
        if isinstance(item, dict):
            if len(item) != 1:
                raise ConfigError(f"env_wrappers: an entry with keyword arguments is one 'module:Name': {{key: value}} "
                                  f"mapping, got {item!r}")
            ((item, kwargs),) = item.items()
        elif isinstance(item, tuple) and len(item) == 2:
            item, kwargs = item
        kwargs = {} if kwargs is None else kwargs
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ConfigError(f"env_wrappers: {item}'s keyword arguments must be a mapping of names to values, "
                              f"got {kwargs!r}")
        path = _wrapper_path(item)
        wrapper_callable(path)
        specs.append({path: dict(kwargs)} if kwargs else path)
    return specs


def _wrapper_path(item: Any) -> str:
    if callable(item) and not isinstance(item, str):
        return callable_path(item, "env wrapper", "my_wrappers.py")
    if not isinstance(item, str):
        raise ConfigError(f"env_wrappers takes 'module:Name' (a gymnasium.Wrapper class, or a function that takes "
                          f"the env and returns one), got {item!r}")
    module, sep, name = item.partition(":") if ":" in item else item.rpartition(".")
    if not (sep and all(part.isidentifier() for part in module.split(".")) and name.isidentifier()):
        raise ConfigError(f"--env-wrapper takes 'module:Name' (or rl-zoo's 'package.module.Name'): a "
                          f"gymnasium.Wrapper class, or a function that takes the env and returns one; got {item!r}")
    return f"{module}:{name}"


def import_named(path: str, flag: str, fits: Callable[[Any], bool], wanted: str) -> Any:
    """What a 'module:Name' given with ``flag`` names, its module imported (from the working
    directory too, as a ``module:EnvId`` env's); ConfigError unless ``fits(it)`` (it is ``wanted``)."""
    module, _, name = path.partition(":")
    try:
        import_user_module(module)
    except ImportError as e:
        raise ConfigError(f"{flag} {path}: cannot import {module!r}: {e}") from None
    found = getattr(sys.modules[module], name, None)
    if not fits(found):
        what = "nothing" if found is None else f"a {type(found).__name__}"
        raise ConfigError(f"{flag} {path}: {module} holds {what} by the name {name!r}, not {wanted}")
    return found


def wrapper_callable(path: str) -> Any:
    """The class or function an env wrapper's 'module:Name' names."""
    return import_named(path, "--env-wrapper", callable, "a wrapper class or function")


def wrap(env: gym.Env, wrappers: tuple[tuple[str, dict[str, Any]], ...]) -> gym.Env:
    """``env`` inside each of ``wrappers`` (their 'module:Name' and keyword arguments), innermost first."""
    for path, kwargs in wrappers:
        name = path.partition(":")[2]
        try:
            wrapped = wrapper_callable(path)(env, **kwargs)
        except ShoalError:
            env.close()
            raise
        except Exception as e:  # the user's wrapper: its mistake, in one line
            env.close()
            raise ShoalError(f"--env-wrapper {path}: {name}(env, **{kwargs}) raised {error_line(e)}") from None
        if not isinstance(wrapped, gym.Env):
            env.close()
            raise ShoalError(f"--env-wrapper {path}: {name}(env, **{kwargs}) returned a {type(wrapped).__name__}, "
                             "not a gymnasium.Env")
        env = wrapped
    return env


@dataclass(frozen=True)
class EnvOptions:
    """What a run asks of its envs besides their constructor's kwargs, the same for every env it
    makes (runners', the evaluator's, the one its spaces come from, a deployed policy's), since
    they change what an observation is."""

    frame_stack: int | None = None
    """The last N observations stacked into one (None: the env's own, Atari's 4, else 1)."""
    info_action_mask: bool = False
    """The legal actions are read from ``info["action_mask"]`` after each reset and step."""
    wrappers: tuple[tuple[str, dict[str, Any]], ...] = ()
    """The user's wrappers ('module:Name' and keyword arguments), innermost first, around the env
    as ``gym.make`` gives it (an Atari game's after its preprocessing)."""

    def __post_init__(self) -> None:
        if self.frame_stack is not None and self.frame_stack < 1:
            raise ConfigError("frame_stack must be at least 1 (1: no stacking)")

    @classmethod
    def of(cls, config: Any) -> EnvOptions:
        """A run's options, from its config (a config without these settings asks for none)."""
        return cls(getattr(config, "frame_stack", None), bool(getattr(config, "info_action_mask", False)),
                   wrapper_pairs(getattr(config, "env_wrappers", ())))

    @property
    def given(self) -> bool:
        """Whether these ask anything of an env: envs served remotely are made by their server."""
        return self.frame_stack is not None or self.info_action_mask or bool(self.wrappers)


def wrapper_pairs(specs: Any) -> tuple[tuple[str, dict[str, Any]], ...]:
    """``env_wrappers`` (see :func:`wrapper_specs`) as ('module:Name', kwargs) pairs."""
    pairs = []
    for spec in specs or ():
        ((path, kwargs),) = spec.items() if isinstance(spec, dict) else [(spec, {})]
        pairs.append((path, dict(kwargs)))
    return tuple(pairs)


NO_OPTIONS = EnvOptions()


def headless() -> bool:
    """Whether this process has no display to open windows on (a server, CI, a container)."""
    return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def make_env(env_id: str, render_mode: str | None = None, kwargs: dict[str, Any] | None = None,
             options: EnvOptions = NO_OPTIONS) -> gym.Env:
    """One Gymnasium env, with the failure of a missing optional dependency made readable.
    ``kwargs`` go to the env's constructor, as ``gym.make(env_id, **kwargs)`` gives them;
    ``options`` say how shoal wraps it."""
    if is_remote(env_id):
        raise ShoalError(f"{env_id} is served remotely: it cannot be rendered or made here as a single env")
    check_env_id(env_id)
    if render_mode == "rgb_array" and headless():
        # rgb_array frames need no display, but pygame.init() would still try one, and SDL prints
        # "error: XDG_RUNTIME_DIR is invalid" though the frames come out fine. MuJoCo's renderer
        # (Gymnasium's) tries GLFW first, which needs a display: EGL renders without one.
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        # render_mode only when one is asked for: Gymnasium passes it to the env's constructor
        # even as None, and a custom env's __init__ need not take it.
        rendering = {} if render_mode is None else {"render_mode": render_mode}
        return _made(env_id, options, **{**(kwargs or {}), **rendering})
    except gym.error.DependencyNotInstalled as e:
        extra = " (`pip install 'shoal[mujoco]'`)" if _entry_point(env_id).startswith("gymnasium.envs.mujoco") else ""
        raise ShoalError(f"environment {env_id!r} needs an extra package{extra}: {e}") from None
    except ShoalError:
        raise
    except Exception as e:  # the env's own constructor failed: say what it said, and where
        given = f" with env_kwargs {kwargs}" if kwargs else ""
        raise ShoalError(f"environment {env_id!r} could not be made{given}: {error_line(e)}") from e


REMOTE_KWARGS = ("env_kwargs and eval_env_kwargs apply to envs made in this process; an env server makes its own: "
                 "give them to `shoal serve-env ENV_ID --env-kwargs KEY=VALUE ...`")
REMOTE_OPTIONS = ("frame_stack, info_action_mask and env_wrappers apply to envs made in this process; an env server "
                  "makes its own: give them to `shoal serve-env ENV_ID --frame-stack N --info-action-mask "
                  "--env-wrapper module:Name`")

FLATTENED = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary, gym.spaces.Tuple, gym.spaces.Dict)


ATARI_FRAME_STACK = 4


def _entry_point(env_id: str) -> str:
    spec = gym.registry.get(env_id.rpartition(":")[2])
    return spec.entry_point if spec is not None and isinstance(spec.entry_point, str) else ""


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` is one of the Arcade Learning Environment's games."""
    return _entry_point(env_id) == "ale_py.env:AtariEnv"


def _made(env_id: str, options: EnvOptions = NO_OPTIONS, **kwargs: Any) -> gym.Env:
    """``gym.make``, with observations that are not a Box (FrozenLake's and Taxi's Discrete, Blackjack's
    Tuple, Dicts of those) flattened into a float32 Box: one-hot for each discrete part, as
    stable-baselines3 encodes Discrete observations. The policies' MLPs take a Box.

    Atari games get the preprocessing every published Atari agent trains with (Mnih et al. 2015;
    Machado et al. 2018), as RLlib applies it to them and stable-baselines3's AtariWrapper does:
    up to 30 no-op actions at reset, each action repeated for 4 frames (the max of the last two
    taken), 84x84 grayscale frames, the last 4 stacked: uint8 observations [4, 84, 84]. The ALE's
    v5 sticky actions (25%) stay. Rewards are not clipped: the returns shoal reports are game
    scores; ``clip_rewards`` clips what the learner sees.

    MiniGrid's observations are a dict of the agent's 7x7 view (uint8 [7, 7, 3]: object, colour
    and state per cell), its direction and the mission's text: they become the view alone
    (MiniGrid's ImgObsWrapper, as its own baselines train), which the image encoders take.

    ``options.wrappers``, the user's, wrap the env first (an Atari game once preprocessed): what
    shoal does next applies to what they give (MiniGrid's view is taken only from a Dict that still
    holds it). ``options.info_action_mask`` puts ``info["action_mask"]`` into the observation, as an
    ``action_mask`` entry would be; ``options.frame_stack`` stacks what all this gives (see
    :func:`stack_frames`), or sets the size of an Atari game's stack."""
    name = f"environment {env_id!r}"
    if is_atari(env_id):
        from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

        base = gym.make(env_id, frameskip=1, **kwargs)  # the wrapper repeats actions itself
        try:
            env = AtariPreprocessing(base, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)
        except gym.error.DependencyNotInstalled:
            base.close()
            raise ShoalError(f"environment {env_id!r} needs opencv for its preprocessing "
                             "(`pip install 'shoal[atari]'`)") from None
        if options.info_action_mask:
            env.close()
            raise ShoalError(f"{name} gives no action mask in its info: Atari games take every action")
        env = wrap(env, options.wrappers)
        stack = ATARI_FRAME_STACK if options.frame_stack is None else options.frame_stack
        return env if stack == 1 else FrameStackObservation(env, stack)
    env = wrap(gym.make(env_id, **kwargs), options.wrappers)
    if options.info_action_mask:
        env = InfoActionMask(env, env_id)
    if _entry_point(env_id).startswith("minigrid.") and isinstance(env.observation_space, gym.spaces.Dict) and (
            "image" in env.observation_space.spaces):
        from minigrid.wrappers import ImgObsWrapper

        env = ImgObsWrapper(env)
    elif gives_action_mask(env):
        env = ActionMaskObservation(env, env_id)
    elif mixed_layout(env.observation_space) is not None:
        if options.frame_stack is not None and options.frame_stack > 1:  # each entry, before the flattening
            env = stack_frames(env, options.frame_stack, name)
        return MixedObservation(env)
    elif isinstance(env.observation_space, FLATTENED):
        from gymnasium.wrappers import DtypeObservation, FlattenObservation

        with warnings.catch_warnings():  # float64 bounds (Gymnasium-Robotics') become float32's, as meant
            warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
            env = DtypeObservation(FlattenObservation(env), np.float32)
    if options.frame_stack is not None and options.frame_stack > 1:
        env = stack_frames(env, options.frame_stack, name)
    return env


def stack_frames(env: gym.Env, n: int, name: str) -> gym.Env:
    """``env`` with its last ``n`` observations as one (Gymnasium's FrameStackObservation; the
    first observation of an episode repeated before it, as there). Vectors [D] become [n, D];
    images gain channels: n x C for HWC frames ([H, W, n x C], the oldest first), [n, H, W] for
    2-D ones, as Atari's stack is. The stack must stay recognisable as an image's channels (the
    smallest dimension, :func:`shoal.policy.image_layout`). A Dict of images and vectors (before
    shoal flattens it) has each entry stacked so, as stable-baselines3's VecFrameStack does."""
    from gymnasium.wrappers import FrameStackObservation, TransformObservation

    from shoal.policy import is_image

    space = env.observation_space
    if getattr(space, "mask_dim", 0):  # a MaskedBox, or a MixedBox of images with a mask
        env.close()
        raise ShoalError(f"{name} gives an action mask: frame_stack stacks observations without one")
    if mixed_layout(space) is not None:
        return _stack_dict(env, n, name)
    if not isinstance(space, gym.spaces.Box):
        env.close()
        raise ShoalError(f"{name}'s observations are a {space}: frame_stack stacks Box observations")
    stacked = FrameStackObservation(env, n)
    if not is_image(space):
        return stacked  # [n, *shape]: the policies flatten it
    to_channels, channels = _image_stack(space, stacked.observation_space, n, f"{name}'s images", stacked)
    return stacked if to_channels is None else TransformObservation(stacked, to_channels, channels)


def _stack_dict(env: gym.Env, n: int, name: str) -> gym.Env:
    """:func:`stack_frames` of a Dict of images and vectors: each image's stack as its channels,
    each other entry [n, ...]."""
    from gymnasium.wrappers import FrameStackObservation, TransformObservation

    from shoal.policy import is_image

    stacked = FrameStackObservation(env, n)
    spaces, convert = dict(stacked.observation_space.spaces), {}
    for key, space in env.observation_space.spaces.items():
        if is_image(space):
            fn, spaces[key] = _image_stack(space, spaces[key], n, f"{name}'s images {key!r}", stacked)
            if fn is not None:
                convert[key] = fn
    if not convert:
        return stacked
    return TransformObservation(stacked, lambda o: {k: convert[k](v) if k in convert else v for k, v in o.items()},
                                gym.spaces.Dict(spaces))


def _image_stack(space: gym.spaces.Box, stack: gym.spaces.Box, n: int, what: str,
                 stacked: gym.Env) -> tuple[Callable[[np.ndarray], np.ndarray] | None, gym.spaces.Box]:
    """How a stack [n, *shape] of images of ``space`` (``stack``, its space) becomes one image with
    n times the channels: the function (None where [n, H, W] is one already) and its space. A stack
    that would not be read as channels closes ``stacked`` and is refused."""
    from shoal.policy import image_layout

    (c, h, w), last = image_layout(space.shape)
    shape = (h, w, n * c) if last else (n * c, h, w)
    if image_layout(shape) != ((n * c, h, w), last):
        stacked.close()
        raise ShoalError(f"frame_stack {n} of {what} {space.shape} gives {n * c} channels, more than the "
                         "images have pixels a side: stack fewer")
    if len(space.shape) == 2:
        return None, stack  # [n, H, W] already
    if last:  # [n, H, W, C] -> [H, W, n x C]
        to_channels = lambda o: np.ascontiguousarray(np.moveaxis(o, 0, 2)).reshape(shape)  # noqa: E731
    else:  # [n, C, H, W] -> [n x C, H, W]
        to_channels = lambda o: o.reshape(shape)  # noqa: E731
    low, high = (to_channels(b) for b in (stack.low, stack.high))
    return to_channels, gym.spaces.Box(low, high, dtype=space.dtype)


class InfoActionMask(gym.Wrapper):
    """An env that gives its legal actions in ``info["action_mask"]`` after each reset and step
    (Gymnasium's Taxi), made one whose observations are a Dict of the observation and that mask
    (1: legal, 0: not), as :class:`ActionMaskObservation` takes them."""

    def __init__(self, env: gym.Env, env_id: str = ""):
        super().__init__(env)
        self.name = f"environment {env_id!r}" if env_id else "the environment"
        choices = action_choices(env.action_space)
        if choices is None:
            raise ShoalError(f"info_action_mask: {self.name}'s actions are continuous ({env.action_space}); masks "
                             "apply to Discrete, MultiDiscrete and MultiBinary actions")
        if isinstance(env.observation_space, gym.spaces.Dict):
            raise ShoalError(f"info_action_mask: {self.name}'s observations are a Dict; give its mask as their "
                             "action_mask entry instead")
        self.observation_space = gym.spaces.Dict({"observation": env.observation_space,
                                                  "action_mask": gym.spaces.MultiBinary(choices)})

    def _with_mask(self, obs: Any, info: dict[str, Any]) -> dict[str, Any]:
        mask = info.get("action_mask")
        if mask is None:
            raise ShoalError(f"info_action_mask: {self.name} gave no info['action_mask'] (its info has "
                             f"{sorted(info) or 'no entries'})")
        mask, need = np.asarray(mask, np.int8).reshape(-1), self.observation_space["action_mask"].n
        if mask.size != need:
            raise ShoalError(f"info_action_mask: {self.name}'s info['action_mask'] has {mask.size} entries, where "
                             f"its action space {self.env.action_space} needs {need}")
        return {"observation": obs, "action_mask": mask}

    def reset(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return self._with_mask(obs, info), info

    def step(self, action: Any) -> tuple[dict[str, Any], Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._with_mask(obs, info), reward, terminated, truncated, info


class MaskedBox(gym.spaces.Box):
    """The flat float32 observations of an env that says which actions are legal: the
    observation's own entries, then ``mask_dim`` entries of its action mask (1: legal, 0: not),
    one per action of a Discrete space, one per value of each element of a MultiDiscrete one.
    Policies read the mask from the last entries (:attr:`shoal.policy.PolicyModule.mask_dim`);
    rollouts, replay, env servers and checkpoints carry it as part of the observation."""

    def __init__(self, low: np.ndarray, high: np.ndarray, mask_dim: int, seed: Any = None):
        super().__init__(low, high, dtype=np.float32, seed=seed)
        self.mask_dim = int(mask_dim)

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other) and getattr(other, "mask_dim", 0) == self.mask_dim

    def __repr__(self) -> str:
        return f"MaskedBox({self.shape[0] - self.mask_dim} observation entries, {self.mask_dim} action mask entries)"


class MixedBox(gym.spaces.Box):
    """The flat float32 observations of a Dict of images and vectors (a camera's frames beside a
    robot's joint angles): each image's pixels as the env gives them (``images``: their shapes,
    in the Dict's order), then the other entries flattened (one-hot for a discrete one). Policies
    read each image with a convolutional encoder of its own and the rest as it is
    (:class:`shoal.policy.MixedEncoder`, as stable-baselines3's MultiInputPolicy); rollouts and
    replay keep the pixels as bytes.

    An env that says which actions are legal and shows images (a board game's planes as pixels)
    gives one too, its last ``mask_dim`` entries the mask (as a :class:`MaskedBox`'s)."""

    def __init__(self, low: np.ndarray, high: np.ndarray, images: tuple[tuple[int, ...], ...], mask_dim: int = 0,
                 seed: Any = None):
        super().__init__(low, high, dtype=np.float32, seed=seed)
        self.images = tuple(tuple(int(d) for d in shape) for shape in images)
        self.pixels = sum(int(np.prod(shape)) for shape in self.images)
        self.mask_dim = int(mask_dim)

    def sample(self, *args: Any, **kwargs: Any) -> np.ndarray:
        """A random observation, its pixels whole numbers as an env's are."""
        sample = super().sample(*args, **kwargs)
        sample[:self.pixels] = np.rint(sample[:self.pixels])
        return sample

    def __eq__(self, other: object) -> bool:
        return (super().__eq__(other) and getattr(other, "images", ()) == self.images
                and getattr(other, "mask_dim", 0) == self.mask_dim)

    def __repr__(self) -> str:
        shapes = ", ".join("x".join(map(str, shape)) for shape in self.images)
        mask = f", {self.mask_dim} action mask entries" if self.mask_dim else ""
        return f"MixedBox(images {shapes}; {self.shape[0] - self.pixels - self.mask_dim} vector entries{mask})"


def mixed_layout(space: gym.Space) -> tuple[list[str], gym.spaces.Dict | None, list[str]] | None:
    """Where a Dict observation space holds images (uint8 Boxes of 2 or 3 dimensions) beside
    other entries: the images' keys, then the space and keys of the rest (None and [] when
    there is none); None for any other space. A goal env's Dict is left to its own flattening
    (hindsight relabelling reads its goals there)."""
    from shoal.policy import is_image

    if not isinstance(space, gym.spaces.Dict) or {"achieved_goal", "desired_goal"} <= space.spaces.keys():
        return None
    images = [k for k, s in space.spaces.items() if is_image(s)]
    if not images:
        return None
    rest = [k for k in space.spaces if k not in images]
    return images, (gym.spaces.Dict({k: space[k] for k in rest}) if rest else None), rest


def flatten_mixed(layout: tuple[list[str], gym.spaces.Dict | None, list[str]], obs: dict[str, Any]) -> np.ndarray:
    """One Dict observation as the flat vector of a :class:`MixedBox`, for its :func:`mixed_layout`."""
    images, rest_space, rest = layout
    parts = [np.asarray(obs[k]).reshape(-1) for k in images]
    if rest_space is not None:
        parts.append(gym.spaces.flatten(rest_space, {k: obs[k] for k in rest}))
    return np.concatenate(parts).astype(np.float32)


def mixed_bounds(space: gym.spaces.Dict, layout: tuple[list[str], gym.spaces.Dict | None, list[str]]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The flat bounds (low, high) of a Dict of images and vectors, for its :func:`mixed_layout`."""
    images, rest_space, _ = layout
    bounds = [(space[k].low.reshape(-1), space[k].high.reshape(-1)) for k in images]
    if rest_space is not None:
        with warnings.catch_warnings():  # float64 bounds become float32's, as meant
            warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
            flat = gym.spaces.flatten_space(rest_space)
        bounds.append((flat.low.reshape(-1), flat.high.reshape(-1)))
    low, high = (np.concatenate(b).astype(np.float32) for b in zip(*bounds))
    return low, high


class MixedObservation(gym.ObservationWrapper):
    """A Dict of images and vectors as one flat float32 vector, a :class:`MixedBox`."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        self.layout = mixed_layout(space)
        assert self.layout is not None, space
        self.observation_space = MixedBox(*mixed_bounds(space, self.layout),
                                          tuple(space[k].shape for k in self.layout[0]))

    def observation(self, observation: Any) -> np.ndarray:
        return flatten_mixed(self.layout, observation)


def action_choices(space: gym.Space) -> int | None:
    """The entries of an action mask for ``space``: a Discrete's actions, a MultiDiscrete's values
    summed over its elements, 2 per element of a MultiBinary; None for continuous actions."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    if isinstance(space, gym.spaces.MultiBinary):
        return 2 * int(np.prod(space.shape))
    return None


def gives_action_mask(env: gym.Env) -> bool:
    """Whether ``env`` says which actions are legal, in one of the two forms in use: a Dict
    observation with an ``action_mask`` entry (RLlib's and PettingZoo's convention), or an
    ``action_masks()`` method (sb3-contrib's MaskablePPO and its ActionMasker wrapper)."""
    space = env.observation_space
    return (isinstance(space, gym.spaces.Dict) and "action_mask" in space.spaces) or env.has_wrapper_attr(
        "action_masks")


class ActionMaskObservation(gym.ObservationWrapper):
    """An env's observations with its action mask as one flat float32 vector (a
    :class:`MaskedBox`): the observation flattened (a Dict's other entries, or its only other
    one; a discrete part one-hot), then the mask, from the observation's ``action_mask`` entry or
    the env's ``action_masks()`` after each reset and step. Where the observation holds images (an
    image alone, or a Dict of images and vectors), a :class:`MixedBox` with the mask last."""

    def __init__(self, env: gym.Env, env_id: str = ""):
        super().__init__(env)
        space = env.observation_space
        name = f"environment {env_id!r}" if env_id else "the environment"
        choices = action_choices(env.action_space)
        if choices is None:
            raise ShoalError(f"{name} gives an action mask, but its actions are continuous ({env.action_space}): "
                             "masks apply to Discrete, MultiDiscrete and MultiBinary actions")
        self.name = name
        self.from_dict = isinstance(space, gym.spaces.Dict) and "action_mask" in space.spaces
        # action_masks() may need a reset first: its masks are checked as they come (observation)
        self.rest_space, self.rest_keys = mask_layout(space) if self.from_dict else (space, [])
        if self.from_dict:
            mask_space = space["action_mask"]
            if not self.rest_keys:
                raise ShoalError(f"{name}'s observations hold only an action mask: they need an observation too")
            if not isinstance(mask_space, (gym.spaces.MultiBinary, gym.spaces.Box)):
                raise ShoalError(f"{name}'s action_mask is a {mask_space}: it must be a MultiBinary or a Box of "
                                 "0s and 1s, one per action")
            if (width := int(np.prod(mask_space.shape))) != choices:
                per = "action" if isinstance(env.action_space, gym.spaces.Discrete) else "value of each element"
                raise ShoalError(f"{name}'s action mask has {width} entries, where its action space "
                                 f"{env.action_space} needs {choices} (one per {per})")
        self.flatten_rest = rest_flattener(self.rest_space)  # worked out once, not per step
        rest = as_dict(self.rest_space)
        mixed = mixed_layout(rest)
        if mixed is not None:  # images: their pixels first, then the other entries and the mask
            low, high = mixed_bounds(rest, mixed)
            images = tuple(rest[k].shape for k in mixed[0])
        else:
            flat = gym.spaces.flatten_space(self.rest_space)
            low, high, images = flat.low.reshape(-1), flat.high.reshape(-1), ()
        low, high = (np.concatenate([b, np.full(choices, v)]).astype(np.float32) for b, v in ((low, 0), (high, 1)))
        self.observation_space = MixedBox(low, high, images, choices) if images else MaskedBox(low, high, choices)

    def observation(self, observation: Any) -> np.ndarray:
        if self.from_dict:
            return flatten_masked(self.flatten_rest, self.rest_keys, observation)
        mask = np.asarray(self.env.get_wrapper_attr("action_masks")())
        if mask.size != self.observation_space.mask_dim:
            raise ShoalError(f"{self.name}'s action_masks() gave {mask.size} entries, where its action space "
                             f"{self.env.action_space} needs {self.observation_space.mask_dim}")
        return masked_observation(self.flatten_rest(observation), mask)


def mask_layout(space: gym.spaces.Dict) -> tuple[gym.Space, list[str]]:
    """What a Dict observation space holds besides its ``action_mask``: its only other entry's
    space, or a Dict of the others; and their keys."""
    rest = {k: s for k, s in space.spaces.items() if k != "action_mask"}
    return (next(iter(rest.values())) if len(rest) == 1 else gym.spaces.Dict(rest)), list(rest)


IMAGE_KEY = "image"
"""The key an image observation beside an action mask (or of an env with ``action_masks()``)
takes in the Dict a :class:`MixedBox` is laid out from."""


def as_dict(space: gym.Space) -> gym.Space:
    """An image space as a Dict of it alone (what :func:`mixed_layout` lays out); any other as it is."""
    from shoal.policy import is_image

    return gym.spaces.Dict({IMAGE_KEY: space}) if is_image(space) else space


def rest_flattener(space: gym.Space) -> Callable[[Any], np.ndarray]:
    """How an observation of ``space``, the one beside an action mask, becomes the first entries
    of the flat vector: as a :class:`MixedBox` lays them out where it holds images (an image
    alone, or a Dict of images and vectors), else flattened (one-hot for a discrete part)."""
    from shoal.policy import is_image

    layout = mixed_layout(as_dict(space))
    if layout is None:
        return lambda obs: np.asarray(gym.spaces.flatten(space, obs), np.float32).reshape(-1)
    if is_image(space):
        return lambda obs: flatten_mixed(layout, {IMAGE_KEY: obs})
    return lambda obs: flatten_mixed(layout, obs)


def flatten_masked(flatten_rest: Callable[[Any], np.ndarray], rest_keys: list[str],
                   obs: dict[str, Any]) -> np.ndarray:
    """One Dict observation with an ``action_mask`` entry as the flat vector of a
    :class:`MaskedBox` or :class:`MixedBox` (what :class:`ActionMaskObservation` makes of it):
    its other entries (``rest_keys``, :func:`mask_layout`'s) by ``flatten_rest``
    (:func:`rest_flattener`'s), then the mask."""
    rest = obs[rest_keys[0]] if len(rest_keys) == 1 else {k: obs[k] for k in rest_keys}
    return masked_observation(flatten_rest(rest), obs["action_mask"])


def masked_observation(flat: np.ndarray, mask: Any) -> np.ndarray:
    """A flattened observation and its action mask as one flat vector."""
    return np.concatenate([flat, np.asarray(mask, np.float32).reshape(-1)])


def file_name(env_id: str) -> str:
    """``env_id`` as part of a file name (``ALE/Pong-v5`` -> ``ALE_Pong-v5``). Env servers are
    named by the env id they serve when the URL gives it (``remote://H1:P1,H2:P2/CartPole-v1`` ->
    ``remote-CartPole-v1``), else by the first server and how many more there are
    (``remote://127.0.0.1:50051,127.0.0.1:50052`` -> ``remote-127.0.0.1_50051+1``)."""
    if is_remote(env_id):
        from shoal.remote.client import parse_url

        (first, *more), served = parse_url(env_id)
        env_id = "remote-" + (served or first + (f"+{len(more)}" if more else ""))
    return env_id.replace("/", "_").replace(":", "_")


def is_remote(env_id: str) -> bool:
    """Whether ``env_id`` names env servers (``remote://HOST:PORT[,...][/ENV_ID]``)."""
    return env_id.startswith("remote://")


def error_line(e: BaseException) -> str:
    """An exception as one line: its type, its message's first line, and the file and line (outside
    Gymnasium and shoal) it was raised at, so that a user whose env fails knows where to look."""
    import sysconfig
    import traceback

    import shoal

    skip = tuple(os.path.realpath(os.path.dirname(m.__file__)) + os.sep for m in (gym, np, shoal)) + tuple(
        os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib"))
    message = str(e).strip().splitlines()[0] if str(e).strip() else ""
    where = ""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if not os.path.realpath(frame.filename).startswith(skip) and not frame.filename.startswith("<"):
            where = f" (at {frame.filename}:{frame.lineno})"
            break
    return f"{type(e).__name__}: {message}{where}" if message else f"{type(e).__name__}{where}"


class ResilientVectorEnv(SyncVectorEnv):
    """Gymnasium's SyncVectorEnv (same-step autoreset) in which an env that raises is replaced.

    The failed env is made again and reset with a fresh seed; the step reports its episode as
    truncated at the last observation it gave (reward 0), ``info["_env_error"]`` marks it, and
    ``env_restarts`` counts it. The episode is lost, not the run.
    """

    def __init__(self, env_fns: list[Any]):
        super().__init__(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
        self.env_restarts = 0
        self.last_error = ""  # what the last env that raised said, for a runner that gives up
        self._base_seed: int | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        if seed is not None:
            self._base_seed = seed
        try:
            return super().reset(seed=seed, options=options)
        except ValueError as e:
            self._check_shapes(e)
            raise

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """SyncVectorEnv's same-step loop, each env's step guarded on its own (a failure part-way
        through Gymnasium's loop would leave the batch half-stepped)."""
        from gymnasium.vector.utils import concatenate, iterate

        infos: dict[str, Any] = {}
        errors = np.zeros(self.num_envs, bool)
        for i, action in enumerate(iterate(self.action_space, actions)):
            try:
                obs, reward, term, trunc, info = self.envs[i].step(action)
            except Exception as e:
                errors[i] = True
                self.last_error = error_line(e)
                obs, reward, term, trunc, info = np.array(self._env_obs[i], copy=True), 0.0, False, True, {}
            try:
                self._rewards[i], self._terminations[i], self._truncations[i] = reward, term, trunc
            except (TypeError, ValueError) as e:
                raise ShoalError(f"env {i} returned the reward {reward!r}, terminated {term!r} and truncated "
                                 f"{trunc!r}: a step's reward is one number and each flag one bool") from e
            if term or trunc:
                infos = self._add_info(infos, {"final_obs": obs, "final_info": info}, i)
                obs, info = self._restart(i) if errors[i] else self.envs[i].reset()
            self._env_obs[i] = obs
            infos = self._add_info(infos, info, i)
        if errors.any():
            infos["_env_error"] = errors
        try:
            self._observations = concatenate(self.single_observation_space, self._env_obs, self._observations)
        except ValueError as e:
            self._check_shapes(e)
            raise
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        return (np.copy(self._observations), np.copy(self._rewards), np.copy(self._terminations),
                np.copy(self._truncations), infos)

    def _check_shapes(self, error: ValueError) -> None:
        """Name the env whose observation does not fit its space, when batching them failed."""
        space = self.single_observation_space
        for i, obs in enumerate(self._env_obs):
            shape, dtype = np.shape(obs), getattr(obs, "dtype", type(obs).__name__)
            if shape != space.shape:
                raise ShoalError(f"env {i} returned an observation of shape {shape} ({dtype}), where its "
                                 f"observation space is {space}: the env does not keep to its space") from error

    def _restart(self, i: int) -> tuple[Any, dict]:
        """Replace env ``i`` with a new one, reset with a seed of its own (reproducible)."""
        try:
            self.envs[i].close()
        except Exception:
            pass  # a broken env may not close cleanly; it is dropped either way
        self.env_restarts += 1
        self.envs[i] = self.env_fns[i]()
        seed = None if self._base_seed is None else self._base_seed + i + 7919 * self.env_restarts
        return self.envs[i].reset(seed=seed)


def make_vector_env(env_id: str, num_envs: int, kwargs: dict[str, Any] | None = None,
                    options: EnvOptions = NO_OPTIONS) -> gym.vector.VectorEnv:
    """A synchronous vector env of ``num_envs`` copies, each made with ``kwargs`` and ``options``.

    Same-step autoreset: when an episode ends, ``step`` returns the first observation of the next
    episode and puts the last one in ``info["final_obs"]``, so a truncated episode can be
    bootstrapped from its true final state. Subprocess vector envs are ~10x slower for cheap envs
    on these machines (MEASURED.md): parallelism comes from runners instead.

    A ``remote://`` id gives a RemoteVectorEnv instead: the servers decide how many envs.
    """
    if is_remote(env_id):
        from shoal.remote.client import RemoteVectorEnv

        _check_remote(kwargs, options)
        return RemoteVectorEnv(env_id)
    make_env(env_id, kwargs=kwargs, options=options).close()  # fail early, with a clear message, before N copies
    kwargs = dict(kwargs or {})
    return ResilientVectorEnv([lambda: _made(env_id, options, **kwargs) for _ in range(num_envs)])


def _check_remote(kwargs: dict[str, Any] | None, options: EnvOptions) -> None:
    if kwargs:
        raise ShoalError(REMOTE_KWARGS)
    if options.given:
        raise ShoalError(REMOTE_OPTIONS)


def env_spaces(env_id: str, kwargs: dict[str, Any] | None = None,
               options: EnvOptions = NO_OPTIONS) -> tuple[gym.Space, gym.Space]:
    """Observation and action space of one copy of ``env_id`` (made with ``kwargs`` and ``options``)."""
    return all_spaces(env_id, kwargs, options)[:2]


def all_spaces(env_id: str, kwargs: dict[str, Any] | None = None,
               options: EnvOptions = NO_OPTIONS) -> tuple[gym.Space, gym.Space, gym.Space | None]:
    """:func:`env_spaces`, and the env's own observation space where shoal flattens it (None
    otherwise, for env servers, which flatten on their side, and where frames are stacked: a
    policy then takes stacks only). An env whose mask comes in its info has its observation's
    own space: a deployed policy takes that observation and the mask as ``action_mask``."""
    if is_remote(env_id):
        _check_remote(kwargs, options)
        from shoal.remote.client import describe
        from shoal.remote.wire import decode_space

        info = describe(env_id)
        return decode_space(info.observation_space), decode_space(info.action_space), None
    env = make_env(env_id, kwargs=kwargs, options=options)
    try:
        own, inner = None, env
        while isinstance(inner, gym.Wrapper) and not isinstance(inner, gym.wrappers.FrameStackObservation):
            if isinstance(inner, InfoActionMask):  # the observation beside the mask, not their Dict
                own = inner.env.observation_space
            elif own is None and isinstance(inner, (gym.wrappers.FlattenObservation, ActionMaskObservation,
                                                    MixedObservation)):
                own = inner.env.observation_space
            inner = inner.env
        return env.observation_space, env.action_space, own
    finally:
        env.close()


def describe_space(space: gym.Space) -> dict[str, Any]:
    """A JSON-friendly description of a Box, Discrete, MultiDiscrete or MultiBinary space
    (checkpoints, network peers)."""
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "multi_discrete", "nvec": space.nvec.tolist(), "start": space.start.tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "multi_binary", "n": list(space.shape)}
    if isinstance(space, gym.spaces.Box):
        layout = ({"mask_dim": space.mask_dim} if isinstance(space, MaskedBox) else
                  {"images": [list(shape) for shape in space.images]} if isinstance(space, MixedBox) else {})
        if isinstance(space, MixedBox) and space.mask_dim:
            layout["mask_dim"] = space.mask_dim
        # Bounds equal everywhere (images' 0 and 255) are kept as one number: an Atari frame stack
        # would otherwise write 56,448 of them.
        bound = lambda a: a.flat[0].item() if a.size and np.all(a == a.flat[0]) else a.tolist()
        return {"type": "box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": bound(space.low), "high": bound(space.high), **layout}
    raise ShoalError(f"unsupported space {space}: shoal handles Box, Discrete, MultiDiscrete and MultiBinary spaces")


def policy_misfit(policy_spaces: tuple[gym.Space, gym.Space], env_spaces: tuple[gym.Space, gym.Space]) -> str | None:
    """Why a policy taking ``policy_spaces`` (observations, actions) cannot act in an env giving
    ``env_spaces``; None when it can. Observations must agree in type, shape, dtype and action
    mask (their bounds the policy never reads: a Gymnasium release that widens them changes
    nothing); actions in their bounds too, which the policy clips to."""

    def layout(space: gym.Space) -> dict[str, Any]:
        desc = describe_space(space)
        return {k: v for k, v in desc.items() if k not in ("low", "high")}

    (p_obs, p_act), (e_obs, e_act) = policy_spaces, env_spaces
    if layout(p_obs) != layout(e_obs) or describe_space(p_act) != describe_space(e_act):
        return (f"the env gives observations {e_obs} and takes actions {e_act}; the policy takes {p_obs} "
                f"and gives {p_act}")
    return None


def space_from_description(desc: dict[str, Any]) -> gym.Space:
    """Inverse of :func:`describe_space`."""
    if desc["type"] == "discrete":
        return gym.spaces.Discrete(desc["n"], start=desc.get("start", 0))
    if desc["type"] == "multi_discrete":
        return gym.spaces.MultiDiscrete(np.asarray(desc["nvec"], np.int64), start=np.asarray(desc["start"], np.int64))
    if desc["type"] == "multi_binary":  # MultiBinary(4), not MultiBinary([4]): the two compare unequal
        return gym.spaces.MultiBinary(desc["n"][0] if len(desc["n"]) == 1 else desc["n"])
    if desc["type"] == "box":
        dtype, shape = np.dtype(desc["dtype"]), tuple(desc["shape"])
        if desc.get("images"):
            return MixedBox(np.broadcast_to(np.asarray(desc["low"], dtype), shape),
                            np.broadcast_to(np.asarray(desc["high"], dtype), shape), desc["images"],
                            desc.get("mask_dim", 0))
        if desc.get("mask_dim"):
            return MaskedBox(np.broadcast_to(np.asarray(desc["low"], dtype), shape),
                             np.broadcast_to(np.asarray(desc["high"], dtype), shape), desc["mask_dim"])
        return gym.spaces.Box(np.broadcast_to(np.asarray(desc["low"], dtype), shape),
                              np.broadcast_to(np.asarray(desc["high"], dtype), shape), shape=shape, dtype=dtype)
    raise ShoalError(f"unknown space type {desc.get('type')!r}")
