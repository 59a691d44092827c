from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Array(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Space(_message.Message):
    __slots__ = ("kind", "shape", "dtype", "low", "high", "n", "start", "nvec", "starts", "mask_dim", "images")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    NVEC_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    MASK_DIM_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    kind: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    low: Array
    high: Array
    n: int
    start: int
    nvec: Array
    starts: Array
    mask_dim: int
    images: _containers.RepeatedCompositeFieldContainer[Shape]
    def __init__(self, kind: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., low: _Optional[_Union[Array, _Mapping]] = ..., high: _Optional[_Union[Array, _Mapping]] = ..., n: _Optional[int] = ..., start: _Optional[int] = ..., nvec: _Optional[_Union[Array, _Mapping]] = ..., starts: _Optional[_Union[Array, _Mapping]] = ..., mask_dim: _Optional[int] = ..., images: _Optional[_Iterable[_Union[Shape, _Mapping]]] = ...) -> None: ...

class Shape(_message.Message):
    __slots__ = ("dims",)
    DIMS_FIELD_NUMBER: _ClassVar[int]
    dims: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dims: _Optional[_Iterable[int]] = ...) -> None: ...

class EnvInfo(_message.Message):
    __slots__ = ("env_id", "num_envs", "observation_space", "action_space")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    num_envs: int
    observation_space: Space
    action_space: Space
    def __init__(self, env_id: _Optional[str] = ..., num_envs: _Optional[int] = ..., observation_space: _Optional[_Union[Space, _Mapping]] = ..., action_space: _Optional[_Union[Space, _Mapping]] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ("env_id",)
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    def __init__(self, env_id: _Optional[str] = ...) -> None: ...

class OpenRequest(_message.Message):
    __slots__ = ("env_id",)
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    def __init__(self, env_id: _Optional[str] = ...) -> None: ...

class OpenReply(_message.Message):
    __slots__ = ("session", "info")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    session: str
    info: EnvInfo
    def __init__(self, session: _Optional[str] = ..., info: _Optional[_Union[EnvInfo, _Mapping]] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("session", "seed")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    session: str
    seed: int
    def __init__(self, session: _Optional[str] = ..., seed: _Optional[int] = ...) -> None: ...

class ResetReply(_message.Message):
    __slots__ = ("obs", "info")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Array
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Array, _Mapping]] = ...) -> None: ...
    OBS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    obs: Array
    info: _containers.MessageMap[str, Array]
    def __init__(self, obs: _Optional[_Union[Array, _Mapping]] = ..., info: _Optional[_Mapping[str, Array]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("session", "actions")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    session: str
    actions: Array
    def __init__(self, session: _Optional[str] = ..., actions: _Optional[_Union[Array, _Mapping]] = ...) -> None: ...

class StepReply(_message.Message):
    __slots__ = ("obs", "rewards", "terminated", "truncated", "final_obs", "info", "env_errors", "env_error")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Array
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Array, _Mapping]] = ...) -> None: ...
    OBS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    FINAL_OBS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    ENV_ERRORS_FIELD_NUMBER: _ClassVar[int]
    ENV_ERROR_FIELD_NUMBER: _ClassVar[int]
    obs: Array
    rewards: Array
    terminated: Array
    truncated: Array
    final_obs: Array
    info: _containers.MessageMap[str, Array]
    env_errors: Array
    env_error: str
    def __init__(self, obs: _Optional[_Union[Array, _Mapping]] = ..., rewards: _Optional[_Union[Array, _Mapping]] = ..., terminated: _Optional[_Union[Array, _Mapping]] = ..., truncated: _Optional[_Union[Array, _Mapping]] = ..., final_obs: _Optional[_Union[Array, _Mapping]] = ..., info: _Optional[_Mapping[str, Array]] = ..., env_errors: _Optional[_Union[Array, _Mapping]] = ..., env_error: _Optional[str] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class CloseReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PolicyRequest(_message.Message):
    __slots__ = ("policy_id",)
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    policy_id: str
    def __init__(self, policy_id: _Optional[str] = ...) -> None: ...

class PolicyInfo(_message.Message):
    __slots__ = ("policy_id", "version", "observation_space", "action_space", "policy_ids", "env_observation_space", "lstm_size")
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    POLICY_IDS_FIELD_NUMBER: _ClassVar[int]
    ENV_OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    LSTM_SIZE_FIELD_NUMBER: _ClassVar[int]
    policy_id: str
    version: int
    observation_space: Space
    action_space: Space
    policy_ids: _containers.RepeatedScalarFieldContainer[str]
    env_observation_space: Space
    lstm_size: int
    def __init__(self, policy_id: _Optional[str] = ..., version: _Optional[int] = ..., observation_space: _Optional[_Union[Space, _Mapping]] = ..., action_space: _Optional[_Union[Space, _Mapping]] = ..., policy_ids: _Optional[_Iterable[str]] = ..., env_observation_space: _Optional[_Union[Space, _Mapping]] = ..., lstm_size: _Optional[int] = ...) -> None: ...

class ActRequest(_message.Message):
    __slots__ = ("policy_id", "obs", "deterministic", "lstm_h", "lstm_c")
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    OBS_FIELD_NUMBER: _ClassVar[int]
    DETERMINISTIC_FIELD_NUMBER: _ClassVar[int]
    LSTM_H_FIELD_NUMBER: _ClassVar[int]
    LSTM_C_FIELD_NUMBER: _ClassVar[int]
    policy_id: str
    obs: Array
    deterministic: bool
    lstm_h: Array
    lstm_c: Array
    def __init__(self, policy_id: _Optional[str] = ..., obs: _Optional[_Union[Array, _Mapping]] = ..., deterministic: _Optional[bool] = ..., lstm_h: _Optional[_Union[Array, _Mapping]] = ..., lstm_c: _Optional[_Union[Array, _Mapping]] = ...) -> None: ...

class ActReply(_message.Message):
    __slots__ = ("actions", "version", "lstm_h", "lstm_c")
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LSTM_H_FIELD_NUMBER: _ClassVar[int]
    LSTM_C_FIELD_NUMBER: _ClassVar[int]
    actions: Array
    version: int
    lstm_h: Array
    lstm_c: Array
    def __init__(self, actions: _Optional[_Union[Array, _Mapping]] = ..., version: _Optional[int] = ..., lstm_h: _Optional[_Union[Array, _Mapping]] = ..., lstm_c: _Optional[_Union[Array, _Mapping]] = ...) -> None: ...
