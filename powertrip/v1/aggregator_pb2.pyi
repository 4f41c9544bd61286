from powertrip.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATE_UNSPECIFIED: _ClassVar[RunState]
    RUN_STATE_WAITING_FOR_SITES: _ClassVar[RunState]
    RUN_STATE_TRAINING: _ClassVar[RunState]
    RUN_STATE_DONE: _ClassVar[RunState]
    RUN_STATE_FAILED: _ClassVar[RunState]
RUN_STATE_UNSPECIFIED: RunState
RUN_STATE_WAITING_FOR_SITES: RunState
RUN_STATE_TRAINING: RunState
RUN_STATE_DONE: RunState
RUN_STATE_FAILED: RunState

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("worker_id", "address", "site_ids", "ready")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SITE_IDS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    site_ids: _containers.RepeatedScalarFieldContainer[str]
    ready: bool
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., site_ids: _Optional[_Iterable[str]] = ..., ready: _Optional[bool] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("run_config_json", "run_seed", "mode", "curtail_config_json")
    RUN_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    RUN_SEED_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    CURTAIL_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    run_config_json: str
    run_seed: int
    mode: str
    curtail_config_json: str
    def __init__(self, run_config_json: _Optional[str] = ..., run_seed: _Optional[int] = ..., mode: _Optional[str] = ..., curtail_config_json: _Optional[str] = ...) -> None: ...

class UpdateHeader(_message.Message):
    __slots__ = ("worker_id", "site_id", "round", "num_samples", "train_seconds", "shard_index", "shard_count", "codec", "train_loss")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    SHARD_COUNT_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    site_id: str
    round: int
    num_samples: float
    train_seconds: float
    shard_index: int
    shard_count: int
    codec: str
    train_loss: float
    def __init__(self, worker_id: _Optional[str] = ..., site_id: _Optional[str] = ..., round: _Optional[int] = ..., num_samples: _Optional[float] = ..., train_seconds: _Optional[float] = ..., shard_index: _Optional[int] = ..., shard_count: _Optional[int] = ..., codec: _Optional[str] = ..., train_loss: _Optional[float] = ...) -> None: ...

class SubmitUpdateRequest(_message.Message):
    __slots__ = ("update", "header", "chunk", "trailer")
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    TRAILER_FIELD_NUMBER: _ClassVar[int]
    update: UpdateHeader
    header: _common_pb2.TensorStreamHeader
    chunk: _common_pb2.TensorChunk
    trailer: _common_pb2.TensorStreamTrailer
    def __init__(self, update: _Optional[_Union[UpdateHeader, _Mapping]] = ..., header: _Optional[_Union[_common_pb2.TensorStreamHeader, _Mapping]] = ..., chunk: _Optional[_Union[_common_pb2.TensorChunk, _Mapping]] = ..., trailer: _Optional[_Union[_common_pb2.TensorStreamTrailer, _Mapping]] = ...) -> None: ...

class UploadReply(_message.Message):
    __slots__ = ("credit_bytes", "result")
    CREDIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    credit_bytes: int
    result: SubmitUpdateResponse
    def __init__(self, credit_bytes: _Optional[int] = ..., result: _Optional[_Union[SubmitUpdateResponse, _Mapping]] = ...) -> None: ...

class SubmitUpdateResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ("max_rounds", "after_round")
    MAX_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    AFTER_ROUND_FIELD_NUMBER: _ClassVar[int]
    max_rounds: int
    after_round: int
    def __init__(self, max_rounds: _Optional[int] = ..., after_round: _Optional[int] = ...) -> None: ...

class RoundSummary(_message.Message):
    __slots__ = ("round", "clock_seconds", "duration_seconds", "selected_site_ids", "contributions", "accuracy", "loss", "outcome", "steps", "start_seconds")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CLOCK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SELECTED_SITE_IDS_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    START_SECONDS_FIELD_NUMBER: _ClassVar[int]
    round: int
    clock_seconds: float
    duration_seconds: float
    selected_site_ids: _containers.RepeatedScalarFieldContainer[str]
    contributions: int
    accuracy: float
    loss: float
    outcome: str
    steps: _containers.RepeatedScalarFieldContainer[int]
    start_seconds: float
    def __init__(self, round: _Optional[int] = ..., clock_seconds: _Optional[float] = ..., duration_seconds: _Optional[float] = ..., selected_site_ids: _Optional[_Iterable[str]] = ..., contributions: _Optional[int] = ..., accuracy: _Optional[float] = ..., loss: _Optional[float] = ..., outcome: _Optional[str] = ..., steps: _Optional[_Iterable[int]] = ..., start_seconds: _Optional[float] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("state", "round", "accuracy", "clock_seconds", "target_accuracy", "time_to_accuracy_seconds", "registered_sites", "expected_sites", "rounds", "policy", "clock", "message", "mode", "active_sites", "energy_kwh", "emissions_kg", "total_rounds", "first_round", "more_rounds")
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    CLOCK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TARGET_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_ACCURACY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_SITES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SITES_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SITES_FIELD_NUMBER: _ClassVar[int]
    ENERGY_KWH_FIELD_NUMBER: _ClassVar[int]
    EMISSIONS_KG_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_ROUND_FIELD_NUMBER: _ClassVar[int]
    MORE_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    state: RunState
    round: int
    accuracy: float
    clock_seconds: float
    target_accuracy: float
    time_to_accuracy_seconds: float
    registered_sites: int
    expected_sites: int
    rounds: _containers.RepeatedCompositeFieldContainer[RoundSummary]
    policy: str
    clock: str
    message: str
    mode: str
    active_sites: int
    energy_kwh: float
    emissions_kg: float
    total_rounds: int
    first_round: int
    more_rounds: bool
    def __init__(self, state: _Optional[_Union[RunState, str]] = ..., round: _Optional[int] = ..., accuracy: _Optional[float] = ..., clock_seconds: _Optional[float] = ..., target_accuracy: _Optional[float] = ..., time_to_accuracy_seconds: _Optional[float] = ..., registered_sites: _Optional[int] = ..., expected_sites: _Optional[int] = ..., rounds: _Optional[_Iterable[_Union[RoundSummary, _Mapping]]] = ..., policy: _Optional[str] = ..., clock: _Optional[str] = ..., message: _Optional[str] = ..., mode: _Optional[str] = ..., active_sites: _Optional[int] = ..., energy_kwh: _Optional[float] = ..., emissions_kg: _Optional[float] = ..., total_rounds: _Optional[int] = ..., first_round: _Optional[int] = ..., more_rounds: _Optional[bool] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetModelReply(_message.Message):
    __slots__ = ("card_json", "header", "chunk", "trailer")
    CARD_JSON_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    TRAILER_FIELD_NUMBER: _ClassVar[int]
    card_json: str
    header: _common_pb2.TensorStreamHeader
    chunk: _common_pb2.TensorChunk
    trailer: _common_pb2.TensorStreamTrailer
    def __init__(self, card_json: _Optional[str] = ..., header: _Optional[_Union[_common_pb2.TensorStreamHeader, _Mapping]] = ..., chunk: _Optional[_Union[_common_pb2.TensorChunk, _Mapping]] = ..., trailer: _Optional[_Union[_common_pb2.TensorStreamTrailer, _Mapping]] = ...) -> None: ...
