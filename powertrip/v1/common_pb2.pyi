from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorSpec(_message.Message):
    __slots__ = ("name", "shape", "dtype")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ...) -> None: ...

class TensorStreamHeader(_message.Message):
    __slots__ = ("tensors", "total_bytes")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    total_bytes: int
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("offset_bytes", "data")
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    offset_bytes: int
    data: bytes
    def __init__(self, offset_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class TensorStreamTrailer(_message.Message):
    __slots__ = ("xxh3_128",)
    XXH3_128_FIELD_NUMBER: _ClassVar[int]
    xxh3_128: str
    def __init__(self, xxh3_128: _Optional[str] = ...) -> None: ...

class SiteProfile(_message.Message):
    __slots__ = ("site_id", "distance_miles", "power_fraction", "modelled_latency_seconds", "modelled_bandwidth_bytes_per_second", "rtt_seconds", "bandwidth_bytes_per_second", "measured_at_seconds", "power_source", "region", "carbon_intensity")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    DISTANCE_MILES_FIELD_NUMBER: _ClassVar[int]
    POWER_FRACTION_FIELD_NUMBER: _ClassVar[int]
    MODELLED_LATENCY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MODELLED_BANDWIDTH_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    RTT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    MEASURED_AT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    POWER_SOURCE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    CARBON_INTENSITY_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    distance_miles: float
    power_fraction: float
    modelled_latency_seconds: float
    modelled_bandwidth_bytes_per_second: float
    rtt_seconds: float
    bandwidth_bytes_per_second: float
    measured_at_seconds: float
    power_source: str
    region: str
    carbon_intensity: float
    def __init__(self, site_id: _Optional[str] = ..., distance_miles: _Optional[float] = ..., power_fraction: _Optional[float] = ..., modelled_latency_seconds: _Optional[float] = ..., modelled_bandwidth_bytes_per_second: _Optional[float] = ..., rtt_seconds: _Optional[float] = ..., bandwidth_bytes_per_second: _Optional[float] = ..., measured_at_seconds: _Optional[float] = ..., power_source: _Optional[str] = ..., region: _Optional[str] = ..., carbon_intensity: _Optional[float] = ...) -> None: ...

class StreamRows(_message.Message):
    __slots__ = ("positions",)
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, positions: _Optional[_Iterable[int]] = ...) -> None: ...

class RoundSpec(_message.Message):
    __slots__ = ("round", "run_seed", "site_ids", "deadline_seconds", "pace_by_power", "power_fraction", "stream_rows", "stream_round")
    class PowerFractionEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class StreamRowsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: StreamRows
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[StreamRows, _Mapping]] = ...) -> None: ...
    ROUND_FIELD_NUMBER: _ClassVar[int]
    RUN_SEED_FIELD_NUMBER: _ClassVar[int]
    SITE_IDS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PACE_BY_POWER_FIELD_NUMBER: _ClassVar[int]
    POWER_FRACTION_FIELD_NUMBER: _ClassVar[int]
    STREAM_ROWS_FIELD_NUMBER: _ClassVar[int]
    STREAM_ROUND_FIELD_NUMBER: _ClassVar[int]
    round: int
    run_seed: int
    site_ids: _containers.RepeatedScalarFieldContainer[str]
    deadline_seconds: float
    pace_by_power: bool
    power_fraction: _containers.ScalarMap[str, float]
    stream_rows: _containers.MessageMap[str, StreamRows]
    stream_round: int
    def __init__(self, round: _Optional[int] = ..., run_seed: _Optional[int] = ..., site_ids: _Optional[_Iterable[str]] = ..., deadline_seconds: _Optional[float] = ..., pace_by_power: _Optional[bool] = ..., power_fraction: _Optional[_Mapping[str, float]] = ..., stream_rows: _Optional[_Mapping[str, StreamRows]] = ..., stream_round: _Optional[int] = ...) -> None: ...
