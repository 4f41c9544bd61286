from powertrip.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrackWorkerRequest(_message.Message):
    __slots__ = ("worker_id", "address", "site_ids")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SITE_IDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    site_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., site_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class TrackWorkerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetSiteProfilesRequest(_message.Message):
    __slots__ = ("time_seconds",)
    TIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    time_seconds: float
    def __init__(self, time_seconds: _Optional[float] = ...) -> None: ...

class GetSiteProfilesResponse(_message.Message):
    __slots__ = ("sites",)
    SITES_FIELD_NUMBER: _ClassVar[int]
    sites: _containers.RepeatedCompositeFieldContainer[_common_pb2.SiteProfile]
    def __init__(self, sites: _Optional[_Iterable[_Union[_common_pb2.SiteProfile, _Mapping]]] = ...) -> None: ...

class MeasureLinksRequest(_message.Message):
    __slots__ = ("worker_ids", "time_seconds")
    WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    TIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    worker_ids: _containers.RepeatedScalarFieldContainer[str]
    time_seconds: float
    def __init__(self, worker_ids: _Optional[_Iterable[str]] = ..., time_seconds: _Optional[float] = ...) -> None: ...

class MeasureLinksResponse(_message.Message):
    __slots__ = ("sites",)
    SITES_FIELD_NUMBER: _ClassVar[int]
    sites: _containers.RepeatedCompositeFieldContainer[_common_pb2.SiteProfile]
    def __init__(self, sites: _Optional[_Iterable[_Union[_common_pb2.SiteProfile, _Mapping]]] = ...) -> None: ...

class GetAvailabilityRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AvailabilityEpisode(_message.Message):
    __slots__ = ("provisioned_seconds", "ready_seconds", "end_seconds")
    PROVISIONED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    READY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    END_SECONDS_FIELD_NUMBER: _ClassVar[int]
    provisioned_seconds: float
    ready_seconds: float
    end_seconds: float
    def __init__(self, provisioned_seconds: _Optional[float] = ..., ready_seconds: _Optional[float] = ..., end_seconds: _Optional[float] = ...) -> None: ...

class SiteAvailability(_message.Message):
    __slots__ = ("site_id", "region", "episodes")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    region: str
    episodes: _containers.RepeatedCompositeFieldContainer[AvailabilityEpisode]
    def __init__(self, site_id: _Optional[str] = ..., region: _Optional[str] = ..., episodes: _Optional[_Iterable[_Union[AvailabilityEpisode, _Mapping]]] = ...) -> None: ...

class CarbonTraceData(_message.Message):
    __slots__ = ("regions", "time_seconds", "intensity", "step_seconds", "label", "source", "start_iso")
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    TIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INTENSITY_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    START_ISO_FIELD_NUMBER: _ClassVar[int]
    regions: _containers.RepeatedScalarFieldContainer[str]
    time_seconds: _containers.RepeatedScalarFieldContainer[float]
    intensity: _containers.RepeatedScalarFieldContainer[float]
    step_seconds: float
    label: str
    source: str
    start_iso: str
    def __init__(self, regions: _Optional[_Iterable[str]] = ..., time_seconds: _Optional[_Iterable[float]] = ..., intensity: _Optional[_Iterable[float]] = ..., step_seconds: _Optional[float] = ..., label: _Optional[str] = ..., source: _Optional[str] = ..., start_iso: _Optional[str] = ...) -> None: ...

class GetAvailabilityResponse(_message.Message):
    __slots__ = ("sites", "threshold", "hold_seconds", "provisioning_seconds", "trace")
    SITES_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    HOLD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PROVISIONING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    sites: _containers.RepeatedCompositeFieldContainer[SiteAvailability]
    threshold: float
    hold_seconds: float
    provisioning_seconds: float
    trace: CarbonTraceData
    def __init__(self, sites: _Optional[_Iterable[_Union[SiteAvailability, _Mapping]]] = ..., threshold: _Optional[float] = ..., hold_seconds: _Optional[float] = ..., provisioning_seconds: _Optional[float] = ..., trace: _Optional[_Union[CarbonTraceData, _Mapping]] = ...) -> None: ...
