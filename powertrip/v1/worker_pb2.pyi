from powertrip.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StartRoundRequest(_message.Message):
    __slots__ = ("spec", "header", "chunk", "trailer")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    TRAILER_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.RoundSpec
    header: _common_pb2.TensorStreamHeader
    chunk: _common_pb2.TensorChunk
    trailer: _common_pb2.TensorStreamTrailer
    def __init__(self, spec: _Optional[_Union[_common_pb2.RoundSpec, _Mapping]] = ..., header: _Optional[_Union[_common_pb2.TensorStreamHeader, _Mapping]] = ..., chunk: _Optional[_Union[_common_pb2.TensorChunk, _Mapping]] = ..., trailer: _Optional[_Union[_common_pb2.TensorStreamTrailer, _Mapping]] = ...) -> None: ...

class StartRoundResponse(_message.Message):
    __slots__ = ("round", "accepted_site_ids")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_SITE_IDS_FIELD_NUMBER: _ClassVar[int]
    round: int
    accepted_site_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, round: _Optional[int] = ..., accepted_site_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ("payload",)
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    def __init__(self, payload: _Optional[bytes] = ...) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ("payload",)
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    def __init__(self, payload: _Optional[bytes] = ...) -> None: ...

class ProbeBandwidthRequest(_message.Message):
    __slots__ = ("total_bytes", "chunk_bytes")
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    total_bytes: int
    chunk_bytes: int
    def __init__(self, total_bytes: _Optional[int] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class ProbeBandwidthResponse(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...
