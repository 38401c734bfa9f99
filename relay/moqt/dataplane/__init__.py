"""Data plane (§11): subgroup streams, fetch / fill streams, datagrams, stream dispatch."""

from .datagram import decode_datagram, encode_datagram
from .fetch import FETCH_HEADER_TYPE, FetchStreamEncoder, FetchStreamParser, encode_fetch_header
from .objects import (
    EndOfRange,
    FetchHeader,
    FetchObject,
    ObjectDatagram,
    Payload,
    SubgroupHeader,
    SubgroupObject,
)
from .subgroup import (
    SubgroupStreamEncoder,
    SubgroupStreamParser,
    decode_subgroup_type_flags,
    encode_subgroup_header,
    encode_subgroup_object_header,
    is_subgroup_type,
)
from .uni import PADDING_STREAM_HEADER, UniStreamParser, classify_stream_type

__all__ = [
    "FETCH_HEADER_TYPE",
    "PADDING_STREAM_HEADER",
    "EndOfRange",
    "FetchHeader",
    "FetchObject",
    "FetchStreamEncoder",
    "FetchStreamParser",
    "ObjectDatagram",
    "Payload",
    "SubgroupHeader",
    "SubgroupObject",
    "SubgroupStreamEncoder",
    "SubgroupStreamParser",
    "UniStreamParser",
    "classify_stream_type",
    "decode_datagram",
    "decode_subgroup_type_flags",
    "encode_datagram",
    "encode_fetch_header",
    "encode_subgroup_header",
    "encode_subgroup_object_header",
    "is_subgroup_type",
]
