"""Arrays and spaces on the wire (``proto/shoal.proto``): raw bytes with a dtype and a shape.

Decoding never unpickles and checks everything it is given: a dtype from a fixed list, a
shape of sane rank and size, and a byte count that matches. What fails raises
:class:`WireError`, which servers turn into INVALID_ARGUMENT.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from shoal.remote import shoal_pb2 as pb

DTYPES = {name: np.dtype(name).newbyteorder("<") for name in (
    "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "bool")}
MAX_RANK = 8


class WireError(ValueError):
    """A message that does not describe a valid array or space."""


# ``dtype.name`` runs Python code in NumPy (~2.7 us a call here): servers encode several arrays per
# message, so the names of the wire's own dtypes are looked up instead.
NAMES = {dtype: name for name, dtype in DTYPES.items()}


def encode(x: np.ndarray) -> pb.Array:
    """An array as a message (little-endian, C order)."""
    x = np.asarray(x)
    name = NAMES.get(x.dtype)
    if name is None:  # big-endian, or a dtype the wire does not carry
        name = x.dtype.name
        if name not in DTYPES:
            raise WireError(f"cannot send dtype {x.dtype}")
    return pb.Array(dtype=name, shape=x.shape, data=x.astype(DTYPES[name], copy=False).tobytes())


def decode(msg: pb.Array, max_elements: int = 1 << 26) -> np.ndarray:
    """The array a message describes (a read-only view of its bytes), or :class:`WireError`."""
    dtype = DTYPES.get(msg.dtype)
    if dtype is None:
        raise WireError(f"unknown dtype {msg.dtype[:32]!r}; expected one of {', '.join(DTYPES)}")
    shape = tuple(msg.shape)
    if len(shape) > MAX_RANK or any(d < 0 for d in shape):
        raise WireError(f"invalid shape {shape[:MAX_RANK + 1]}")
    count = 1
    for d in shape:
        count *= d
        if count > max_elements:
            raise WireError(f"array of shape {shape} is larger than {max_elements} elements")
    if len(msg.data) != count * dtype.itemsize:
        raise WireError(f"{len(msg.data)} bytes do not hold a {msg.dtype} array of shape {shape}")
    return np.frombuffer(msg.data, dtype=dtype).reshape(shape)


def encode_space(space: gym.Space) -> pb.Space:
    """A Gymnasium space as a message."""
    if isinstance(space, gym.spaces.Box):
        return pb.Space(kind="box", shape=space.shape, dtype=space.dtype.name, low=encode(space.low),
                        high=encode(space.high), mask_dim=getattr(space, "mask_dim", 0),
                        images=[pb.Shape(dims=shape) for shape in getattr(space, "images", ())])
    if isinstance(space, gym.spaces.Discrete):
        return pb.Space(kind="discrete", shape=(), dtype=space.dtype.name, n=int(space.n), start=int(space.start))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return pb.Space(kind="multi_discrete", shape=space.shape, dtype=space.dtype.name, nvec=encode(space.nvec),
                        starts=encode(space.start))
    if isinstance(space, gym.spaces.MultiBinary):
        return pb.Space(kind="multi_binary", shape=space.shape, dtype=space.dtype.name)
    raise WireError(f"cannot describe a {type(space).__name__} space")


def decode_space(msg: pb.Space) -> gym.Space:
    """The Gymnasium space a message describes."""
    if msg.kind == "box":
        low, high = decode(msg.low), decode(msg.high)
        if msg.images:
            return _mixed(low, high, msg)
        if msg.mask_dim:
            from shoal.envs import MaskedBox

            if DTYPES[msg.dtype] != np.float32 or low.ndim != 1 or not 0 < msg.mask_dim < len(low):
                raise WireError(f"an action mask of {msg.mask_dim} entries in a {msg.dtype} box of shape {low.shape}: "
                                "a mask ends a flat float32 box, after one observation entry or more")
            return MaskedBox(low, high, msg.mask_dim)
        return gym.spaces.Box(low, high, dtype=DTYPES[msg.dtype])
    if msg.kind == "discrete":
        return gym.spaces.Discrete(msg.n, start=msg.start)
    if msg.kind == "multi_discrete":
        nvec = decode(msg.nvec)
        starts = decode(msg.starts) if msg.HasField("starts") else np.zeros_like(nvec)
        if starts.shape != nvec.shape:
            raise WireError(f"a multi_discrete space's starts {starts.shape} and nvec {nvec.shape} differ in shape")
        return gym.spaces.MultiDiscrete(nvec, start=starts)
    if msg.kind == "multi_binary":  # MultiBinary(5), not MultiBinary([5]): the two compare unequal
        return gym.spaces.MultiBinary(msg.shape[0] if len(msg.shape) == 1 else list(msg.shape))
    raise WireError(f"unknown space kind {msg.kind[:32]!r}")


def check_actions(space: gym.Space, actions: np.ndarray, num_envs: int) -> np.ndarray:
    """``actions`` [num_envs, *shape] if they fit ``space`` (dtype kind, shape, bounds), else WireError."""
    shape = (num_envs, *space.shape)
    if actions.shape != shape:
        raise WireError(f"actions must have shape {shape}, got {actions.shape}")
    if isinstance(space, gym.spaces.Box):
        if actions.dtype.kind != "f":
            raise WireError(f"actions must be floating point for a box space, got {actions.dtype}")
        if not np.all(np.isfinite(actions)):
            raise WireError("actions must be finite")
        if np.any(actions < space.low) or np.any(actions > space.high):
            raise WireError(f"actions out of bounds [{space.low.min()}, {space.high.max()}]")
        return actions.astype(space.dtype)
    if actions.dtype.kind not in "iub":
        raise WireError(f"actions must be integers for a {type(space).__name__} space, got {actions.dtype}")
    if isinstance(space, gym.spaces.Discrete):
        lo, hi = space.start, space.start + space.n - 1
    elif isinstance(space, gym.spaces.MultiDiscrete):
        lo, hi = space.start, space.start + space.nvec - 1
    else:
        lo, hi = 0, 1
    if np.any(actions < lo) or np.any(actions > hi):
        raise WireError(f"actions out of bounds [{np.min(lo)}, {np.max(hi)}]")
    return actions.astype(space.dtype)


FINAL_INFO = "final_info/"
"""Prefix of the entries of ``info["final_info"]`` (the info of the steps that ended episodes)
in a StepReply's info, their masks ``_KEY`` too."""


def encode_info(info: dict, num_envs: int) -> dict[str, pb.Array]:
    """The numeric per-env entries of a vector env's info dict (others are not sent), and those of
    its ``final_info`` with their masks, under :data:`FINAL_INFO`."""
    out = {}
    for key, value in info.items():
        if key in ("final_obs", "final_info") or key.startswith("_"):
            continue
        if isinstance(value, np.ndarray) and value.dtype.name in DTYPES and value.shape[:1] == (num_envs,):
            out[key] = encode(value)
    final = info.get("final_info")
    if isinstance(final, dict):
        for key, value in final.items():
            if isinstance(value, np.ndarray) and value.dtype.name in DTYPES and value.shape == (num_envs,):
                out[FINAL_INFO + key] = encode(value)
    return out


def decode_final_info(entries: Any) -> dict[str, np.ndarray]:
    """``info["final_info"]`` from a StepReply's info entries (see :func:`encode_info`)."""
    return {key[len(FINAL_INFO):]: decode(value) for key, value in entries.items() if key.startswith(FINAL_INFO)}


def _mixed(low: np.ndarray, high: np.ndarray, msg: pb.Space) -> gym.Space:
    """A box of images' pixels and a vector (:class:`shoal.envs.MixedBox`), checked: its images
    must be 2 or 3 dimensions of at least one pixel, within a flat float32 box; an action mask
    (``mask_dim``) after them."""
    from shoal.envs import MixedBox

    shapes = [tuple(shape.dims) for shape in msg.images]
    if DTYPES[msg.dtype] != np.float32 or low.ndim != 1 or len(shapes) > 64 or any(
            len(s) not in (2, 3) or min(s) < 1 or max(s) > 1 << 16 for s in shapes):
        raise WireError(f"images of shapes {shapes[:4]} in a {msg.dtype} box of shape {low.shape}: images have 2 or "
                        "3 dimensions and lie in a flat float32 box")
    if msg.mask_dim < 0 or sum(int(np.prod(s)) for s in shapes) + msg.mask_dim > len(low):
        raise WireError(f"images of shapes {shapes} and an action mask of {msg.mask_dim} entries do not fit in a box "
                        f"of {len(low)} entries")
    return MixedBox(low, high, shapes, msg.mask_dim)
