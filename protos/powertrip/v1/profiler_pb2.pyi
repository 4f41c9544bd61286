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
