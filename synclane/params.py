"""How worker connections send the parameters of their statements.

Lists go in PostgreSQL's binary array format: psycopg's text format quotes and escapes every
element with a regular expression. The ids, tokens and counts a worker sends with every take,
page save and heartbeat go as `Bigints` and `Uuids`: packed in one call each, always typed
`bigint[]` and `uuid[]`. psycopg types a list of ints by its largest element (smallint[],
integer[] or bigint[]) and an empty list not at all, and prepares a statement once per
combination of types: the take statement was planned again (about 3 ms) for each.
"""

from __future__ import annotations

import struct
from uuid import UUID

import psycopg
from psycopg.adapt import AdaptersMap, Dumper
from psycopg.pq import Format
from psycopg.types.array import ListBinaryDumper

_INT8, _INT8_ARRAY, _UUID, _UUID_ARRAY = 20, 1016, 2950, 2951
# a binary array: dimensions, has-nulls, element type; then (one dimension) its length and lower
# bound; then each element as its length and its bytes
_EMPTY = struct.Struct("!iiI")
_ONE_DIMENSION = struct.Struct("!iiIii")
_UUID_LENGTH = struct.pack("!i", 16)


def _array(element: int, count: int, elements: bytes) -> bytes:
    if not count:
        return _EMPTY.pack(0, 0, element)
    return _ONE_DIMENSION.pack(1, 0, element, count, 1) + elements


class Bigints(list[int]):
    """A list of ints sent as bigint[] (no NULL elements)."""


class Uuids(list[UUID]):
    """A list of UUIDs sent as uuid[] (no NULL elements)."""


class _BigintsDumper(Dumper):
    format = Format.BINARY
    oid = _INT8_ARRAY

    def dump(self, obj: Bigints) -> bytes:
        parts = [part for value in obj for part in (8, value)]
        return _array(_INT8, len(obj), struct.pack(f"!{'iq' * len(obj)}", *parts))


class _UuidsDumper(Dumper):
    format = Format.BINARY
    oid = _UUID_ARRAY

    def dump(self, obj: Uuids) -> bytes:
        return _array(_UUID, len(obj), b"".join(_UUID_LENGTH + value.bytes for value in obj))


WORKER_ADAPTERS = AdaptersMap(psycopg.adapters)
WORKER_ADAPTERS.register_dumper(list, ListBinaryDumper)
WORKER_ADAPTERS.register_dumper(Bigints, _BigintsDumper)
WORKER_ADAPTERS.register_dumper(Uuids, _UuidsDumper)
