#!/usr/bin/env python3
"""Cross-check protoplane against the official Python protobuf runtime.

What is checked
---------------
For several message types of our own test schemas (tests/conformance/protos,
proto2 and proto3) this script generates random messages with a seeded RNG and
derives wire inputs from them:

* canonical encodings, as produced by Python's deterministic serializer;
* non-canonical but valid encodings, made by a wire-level rewriter in this
  file: records of different field numbers shuffled, packed <-> unpacked
  repeated scalars, an earlier conflicting occurrence of a singular scalar
  (last one wins), an earlier occurrence of another member of the same oneof,
  singular sub-messages split into two occurrences (they merge), duplicate map
  keys, map entries without default-valued key/value, empty packed records,
  unknown fields of every wire type (varint, i64, LEN, group, i32) at numbers
  that are not in the schema, and overlong varints (values, lengths and, to 5
  bytes, tags);
* inputs whose meaning differs from the original but which are still valid:
  a known field number with the wrong wire type (becomes an unknown field),
  unknown values of closed enums (go to the unknown fields; in a map value
  the whole entry does), high bits set in 32-bit varints, NaN payloads; with
  ``--gray-areas`` also unknown fields inside map entries, which the spec
  leaves open (see GRAY);
* malformed inputs (truncation, wire types 6/7, field number 0 or > 2^29-1,
  lengths past the end, 11-byte varints, unbalanced groups, invalid UTF-8 in
  proto3 strings).  Whether an input really is malformed is decided by Python.

Each input is fed to the protoplane CLI and the results are compared with
Python's:

* ``roundtrip --delimited --deterministic`` with and without ``--view``: the
  re-encoded bytes must equal ``Msg.FromString(b).SerializeToString(
  deterministic=True)`` (with map entries in ascending key order, see below);
* inputs Python rejects (``DecodeError``): one process per input, which must
  exit with status 1 and print exactly one line on stderr;
* ``decode --delimited``: each JSON line must match ``MessageToJson`` (compared
  semantically: floats with a relative tolerance of 1e-6 or equal as float32,
  everything else exactly);
* ``encode --delimited --deterministic``: each of Python's own JSON lines must
  encode to the bytes Python's ``json_format.Parse`` + deterministic
  serialization produce.

Why Python is the oracle
------------------------
The ``protobuf`` package (upb backend) is maintained by the protobuf team and
follows the language specification and the conformance suite; its behaviour
on every corner case above (merging, last-one-wins, unknown-field order,
closed-enum handling, JSON mapping) is what protoplane promises to reproduce.
A few upb choices that the spec leaves open are noted next to the mutations
that trigger them, so mismatches can be triaged.  Two deliberate departures:

* upb's deterministic map order is idiosyncratic (integer keys descending as
  unsigned numbers; see ascending_map_order()).  Expected outputs are
  re-sorted by ascending key, the order of C++, Java and Go;
  ``--python-map-order`` keeps upb's order.
* Python's JSON parser rejects the +-FLT_MAX that its printer emits; see
  json_expectation().

The harness also checks itself against Python alone (its wire parser must
re-encode canonical bytes exactly, semantics-preserving rewrites must parse to
the original message); such failures are reported as harness errors.

Usage
-----
    scripts/setup-python.sh
    .venv/bin/python tests/conformance/crosscheck.py \\
        --protoplane target/release/protoplane [--count N] [--seed S] [--out-dir DIR]

``--python-only`` runs just the generator/rewriter self-checks; ``--help``
lists the other options.  The last line printed is
``crosscheck: N passed, M failed``; the exit status is 0 only if M is 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

try:
    from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
    from google.protobuf.descriptor import Descriptor, FieldDescriptor
    from google.protobuf.message import DecodeError, EncodeError
except ImportError:  # pragma: no cover - environment problem, not a test result
    sys.exit("crosscheck: the protobuf package is missing; run scripts/setup-python.sh "
             "and use .venv/bin/python")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
PROTO_ROOT_REL = os.path.join("tests", "conformance", "protos")
PROTO_FILES = ["conformance/test2.proto", "conformance/test3.proto"]

# (schema file, fully qualified message type) pairs that are cross-checked.
TYPES = [
    ("conformance/test2.proto", "pp.test2.AllTypes"),
    ("conformance/test2.proto", "pp.test2.Defaults"),
    ("conformance/test2.proto", "pp.test2.Maps"),
    ("conformance/test2.proto", "pp.test2.Tree"),
    ("conformance/test3.proto", "pp.test3.AllTypes3"),
    ("conformance/test3.proto", "pp.test3.Maps3"),
    ("conformance/test3.proto", "pp.test3.Tree3"),
]

MAX_FIELD_NUMBER = (1 << 29) - 1
RESERVED_NUMBERS = range(19000, 20000)
MASK32 = (1 << 32) - 1
MASK64 = (1 << 64) - 1

# Wire types.
VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
RAW = -1  # pseudo wire type: a record whose bytes are emitted verbatim

F = FieldDescriptor
VARINT_TYPES = {F.TYPE_INT32, F.TYPE_INT64, F.TYPE_UINT32, F.TYPE_UINT64,
                F.TYPE_SINT32, F.TYPE_SINT64, F.TYPE_BOOL, F.TYPE_ENUM}
I64_TYPES = {F.TYPE_FIXED64, F.TYPE_SFIXED64, F.TYPE_DOUBLE}
I32_TYPES = {F.TYPE_FIXED32, F.TYPE_SFIXED32, F.TYPE_FLOAT}
NUMERIC_TYPES = VARINT_TYPES | I64_TYPES | I32_TYPES
MESSAGE_TYPES = {F.TYPE_MESSAGE, F.TYPE_GROUP}
NARROW_VARINT_TYPES = {F.TYPE_INT32, F.TYPE_UINT32, F.TYPE_SINT32, F.TYPE_BOOL, F.TYPE_ENUM}

STRUCT_FORMATS = {
    F.TYPE_FIXED32: "<I", F.TYPE_SFIXED32: "<i", F.TYPE_FLOAT: "<f",
    F.TYPE_FIXED64: "<Q", F.TYPE_SFIXED64: "<q", F.TYPE_DOUBLE: "<d",
}


def natural_wire_type(fd: FieldDescriptor) -> int:
    """Wire type of one (unpacked) value of this field."""
    if fd.type in VARINT_TYPES:
        return VARINT
    if fd.type in I64_TYPES:
        return I64
    if fd.type in I32_TYPES:
        return I32
    if fd.type == F.TYPE_GROUP:
        return SGROUP
    return LEN


def is_packable(fd: Optional[FieldDescriptor]) -> bool:
    return fd is not None and fd.is_repeated and fd.type in NUMERIC_TYPES


def is_map_field(fd: Optional[FieldDescriptor]) -> bool:
    return (fd is not None and fd.type == F.TYPE_MESSAGE and fd.is_repeated
            and fd.message_type.GetOptions().map_entry)


def is_map_entry(desc: Optional[Descriptor]) -> bool:
    return desc is not None and desc.GetOptions().map_entry


# ---------------------------------------------------------------------------
# Varints
# ---------------------------------------------------------------------------

def encode_varint(value: int, pad: int = 0) -> bytes:
    """Encode an unsigned value (< 2^64) as a varint.

    ``pad`` extra bytes make the encoding overlong: the last significant byte
    gets a continuation bit, followed by 0x80 bytes and a final 0x00.  Callers
    keep the total at 10 bytes or fewer.
    """
    assert 0 <= value <= MASK64, value
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            break
    if pad > 0:
        out[-1] |= 0x80
        out.extend(b"\x80" * (pad - 1))
        out.append(0)
    return bytes(out)


def varint_size(value: int) -> int:
    return len(encode_varint(value))


def decode_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    for i in range(10):
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result & MASK64, pos
    raise ValueError("varint longer than 10 bytes")


def delimited(messages: list[bytes]) -> bytes:
    return b"".join(encode_varint(len(m)) + m for m in messages)


def split_delimited(data: bytes) -> tuple[list[bytes], Optional[str]]:
    """Split a varint-length-prefixed stream; returns (messages, error)."""
    out, pos = [], 0
    while pos < len(data):
        try:
            size, pos = decode_varint(data, pos)
        except ValueError as exc:
            return out, f"bad length prefix at offset {pos}: {exc}"
        if pos + size > len(data):
            return out, f"message at offset {pos} runs past the end of the stream"
        out.append(data[pos:pos + size])
        pos += size
    return out, None


# ---------------------------------------------------------------------------
# Wire-level record tree
# ---------------------------------------------------------------------------

@dataclass(eq=False)
class Rec:
    """One wire record, or one element of a packed record (num == 0).

    value:    VARINT -> int; I32/I64 -> bytes; LEN -> payload bytes unless
              ``children``/``elems`` is set; RAW -> bytes written verbatim.
    children: parsed sub-message (LEN) or group body (SGROUP).
    elems:    tagless elements of a packed repeated scalar (LEN).
    fd:       the schema field, or None for unknown fields.
    pad / len_pad / tag_pad: extra bytes for overlong value / length / tag.
    """
    num: int
    wt: int
    value: object = None
    children: Optional[list["Rec"]] = None
    elems: Optional[list["Rec"]] = None
    fd: Optional[FieldDescriptor] = None
    pad: int = 0
    len_pad: int = 0
    tag_pad: int = 0


def raw(data: bytes) -> Rec:
    return Rec(0, RAW, data)


def encode_value(rec: Rec) -> bytes:
    """Encode the value part of a record (no tag)."""
    if rec.wt == VARINT:
        return encode_varint(rec.value, rec.pad)
    if rec.wt in (I32, I64):
        return rec.value
    if rec.wt == LEN:
        payload = len_payload(rec)
        return encode_varint(len(payload), rec.len_pad) + payload
    raise AssertionError(f"no value encoding for wire type {rec.wt}")


def len_payload(rec: Rec) -> bytes:
    """The bytes after the length prefix of a LEN record."""
    if rec.children is not None:
        return encode_records(rec.children)
    if rec.elems is not None:
        return b"".join(encode_value(e) for e in rec.elems)
    return rec.value


def encode_record(rec: Rec) -> bytes:
    if rec.wt == RAW:
        return rec.value
    tag = encode_varint(rec.num << 3 | rec.wt, rec.tag_pad)
    if rec.wt == SGROUP:
        return tag + encode_records(rec.children) + encode_varint(rec.num << 3 | EGROUP)
    return tag + encode_value(rec)


def encode_records(recs: list[Rec]) -> bytes:
    return b"".join(encode_record(r) for r in recs)


def parse_records(buf: bytes, desc: Optional[Descriptor]) -> list[Rec]:
    """Parse a (valid) message encoding into records, using the schema to
    recognise sub-messages, groups and packed fields.  Overlong varints are
    remembered as padding, so encode_records() gives back the same bytes."""
    recs, pos = _parse_fields(buf, 0, desc, None)
    if pos != len(buf):
        raise ValueError("trailing bytes after message")
    return recs


def _parse_fields(buf: bytes, pos: int, desc: Optional[Descriptor],
                  group_num: Optional[int]) -> tuple[list[Rec], int]:
    recs = []
    while pos < len(buf):
        start = pos
        key, pos = decode_varint(buf, pos)
        num, wt = key >> 3, key & 7
        tag_pad = pos - start - varint_size(key)
        if wt == EGROUP:
            if num != group_num:
                raise ValueError("unbalanced END_GROUP")
            return recs, pos
        fd = desc.fields_by_number.get(num) if desc is not None else None
        if fd is not None and wt != natural_wire_type(fd) and not (wt == LEN and is_packable(fd)):
            fd = None  # wrong wire type: an unknown field as far as parsing goes
        rec = Rec(num, wt, fd=fd, tag_pad=tag_pad)
        if wt == VARINT:
            start = pos
            rec.value, pos = decode_varint(buf, pos)
            rec.pad = pos - start - varint_size(rec.value)
        elif wt == I64:
            rec.value, pos = buf[pos:pos + 8], pos + 8
        elif wt == I32:
            rec.value, pos = buf[pos:pos + 4], pos + 4
        elif wt == LEN:
            start = pos
            size, pos = decode_varint(buf, pos)
            rec.len_pad = pos - start - varint_size(size)
            payload, pos = buf[pos:pos + size], pos + size
            if fd is not None and fd.type == F.TYPE_MESSAGE:
                rec.children = parse_records(payload, fd.message_type)
            elif fd is not None and is_packable(fd):
                rec.elems = parse_packed(payload, fd)
            else:
                rec.value = payload
        elif wt == SGROUP:
            sub = fd.message_type if fd is not None else None
            rec.children, pos = _parse_fields(buf, pos, sub, num)
        else:
            raise ValueError(f"invalid wire type {wt}")
        if pos > len(buf):
            raise ValueError("truncated record")
        recs.append(rec)
    if group_num is not None:
        raise ValueError("unterminated group")
    return recs, pos


def parse_packed(payload: bytes, fd: FieldDescriptor) -> list[Rec]:
    wt = natural_wire_type(fd)
    elems, pos = [], 0
    while pos < len(payload):
        start, pad = pos, 0
        if wt == VARINT:
            value, pos = decode_varint(payload, pos)
            pad = pos - start - varint_size(value)
        else:
            width = 8 if wt == I64 else 4
            value, pos = payload[pos:pos + width], pos + width
        elems.append(Rec(0, wt, value, fd=fd, pad=pad))
    return elems


def walk(recs: list[Rec]):
    """Yield every record of a tree (pre-order), including packed elements."""
    for rec in recs:
        yield rec
        if rec.children is not None:
            yield from walk(rec.children)
        if rec.elems is not None:
            yield from rec.elems


def message_levels(recs: list[Rec], desc: Optional[Descriptor]):
    """Yield (record list, descriptor) for the root and every nested message
    or group body whose type is known (including map entries)."""
    yield recs, desc
    for rec in recs:
        if rec.children is not None and rec.fd is not None:
            yield from message_levels(rec.children, rec.fd.message_type)


# ---------------------------------------------------------------------------
# Schema loading
# ---------------------------------------------------------------------------

@dataclass
class Schema:
    pool: descriptor_pool.DescriptorPool
    classes: dict
    proto3_files: set
    synthetic_oneofs: set  # full names of proto3-optional oneofs

    def message_class(self, desc: Descriptor):
        return message_factory.GetMessageClass(desc)

    def is_proto3(self, desc: Descriptor) -> bool:
        return desc.file.name in self.proto3_files


def compile_schema(workdir: str) -> Schema:
    """Compile the test protos with the protoc bundled in grpcio-tools and load
    every message class from the resulting FileDescriptorSet."""
    out = os.path.join(workdir, "schema.pb")
    cmd = [sys.executable, "-m", "grpc_tools.protoc", "-I", PROTO_ROOT_REL,
           f"--descriptor_set_out={out}", "--include_imports", *PROTO_FILES]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"crosscheck: protoc failed:\n{proc.stderr}")
    with open(out, "rb") as fh:
        fds = descriptor_pb2.FileDescriptorSet.FromString(fh.read())
    pool = descriptor_pool.DescriptorPool()
    proto3_files, synthetic = set(), set()
    for fproto in fds.file:
        pool.Add(fproto)
        if fproto.syntax == "proto3":
            proto3_files.add(fproto.name)

        def visit(mproto, prefix):
            name = f"{prefix}.{mproto.name}"
            for fld in mproto.field:
                if fld.proto3_optional:
                    synthetic.add(f"{name}.{mproto.oneof_decl[fld.oneof_index].name}")
            for nested in mproto.nested_type:
                visit(nested, name)

        for mproto in fproto.message_type:
            visit(mproto, fproto.package)
    classes = message_factory.GetMessageClassesForFiles([f.name for f in fds.file], pool)
    return Schema(pool, classes, proto3_files, synthetic)


# ---------------------------------------------------------------------------
# Random values
# ---------------------------------------------------------------------------

INT_RANGES = {
    F.TYPE_INT32: (32, True), F.TYPE_SINT32: (32, True), F.TYPE_SFIXED32: (32, True),
    F.TYPE_INT64: (64, True), F.TYPE_SINT64: (64, True), F.TYPE_SFIXED64: (64, True),
    F.TYPE_UINT32: (32, False), F.TYPE_FIXED32: (32, False),
    F.TYPE_UINT64: (64, False), F.TYPE_FIXED64: (64, False),
}

FLOAT_EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, float("inf"), float("-inf"), float("nan"),
               3.4028234663852886e38, -3.4028234663852886e38,  # float32 max
               1.1754943508222875e-38, 1.401298464324817e-45,  # smallest normal/subnormal
               16777217.0, 0.1, 1e-7, 123456.789]
DOUBLE_EDGES = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"),
                sys.float_info.max, -sys.float_info.max, sys.float_info.min,
                5e-324, 2.0 ** 53 + 1, 0.1, 1e21, 1e-7, 9007199254740993.0, -123.456e-300]

# Code points chosen to stress UTF-8 and JSON escaping: ASCII controls, quote,
# backslash, DEL, 2/3/4-byte sequences, JSON's troublesome U+2028/U+2029,
# U+FEFF, the last BMP and the last Unicode scalar value.
SPECIAL_CHARS = ["\x00", "\x01", "\x1f", "\n", "\r", "\t", "\b", "\f", '"', "\\", "/",
                 "\x7f", "\x80", "é", "ÿ", "Ā", "߿", "ࠀ", "中", "文", "\u2028", "\u2029",
                 "\ufeff", "\ufffd", "\uffff", "\U00010000", "😀", "🦀", "\U0010ffff"]


class Generator:
    """Builds random messages through the Python API, driven by the schema."""

    def __init__(self, rng: random.Random, schema: Schema, max_depth: int = 5):
        self.rng = rng
        self.schema = schema
        self.max_depth = max_depth
        self.budget = 0

    # -- scalars ---------------------------------------------------------
    def integer(self, ftype: int) -> int:
        bits, signed = INT_RANGES[ftype]
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        r = self.rng.random()
        if r < 0.35:
            return self.rng.choice([0, 1, hi, lo, hi - 1, lo + 1, 127, 128, 16383, 16384,
                                    (1 << 31) - 1 if bits == 64 else hi, -1 if signed else 1,
                                    -64 if signed else 63, -65 if signed else 64])
        width = self.rng.randint(1, bits - (1 if signed else 0))
        value = self.rng.getrandbits(width)
        if signed and self.rng.random() < 0.5:
            value = -value - (1 if self.rng.random() < 0.5 else 0)
        return max(lo, min(hi, value))

    def float32(self) -> float:
        r = self.rng.random()
        if r < 0.4:
            return self.rng.choice(FLOAT_EDGES)
        if r < 0.6:  # arbitrary bit pattern: subnormals, NaN payloads, huge, tiny
            return struct.unpack("<f", struct.pack("<I", self.rng.getrandbits(32)))[0]
        value = self.rng.uniform(-1, 1) * 10 ** self.rng.randint(-10, 10)
        return struct.unpack("<f", struct.pack("<f", value))[0]

    def float64(self) -> float:
        r = self.rng.random()
        if r < 0.4:
            return self.rng.choice(DOUBLE_EDGES)
        if r < 0.6:
            return struct.unpack("<d", struct.pack("<Q", self.rng.getrandbits(64)))[0]
        return self.rng.uniform(-1, 1) * 10 ** self.rng.randint(-300, 300)

    def string(self) -> str:
        r = self.rng.random()
        if r < 0.15:
            return ""
        if r < 0.2:  # long
            return "".join(self.rng.choice("abcxyz0189 é中😀") for _ in range(self.rng.randint(200, 3000)))
        n = self.rng.randint(1, 24)
        out = []
        for _ in range(n):
            p = self.rng.random()
            if p < 0.55:
                out.append(chr(self.rng.randint(0x20, 0x7e)))
            elif p < 0.85:
                out.append(self.rng.choice(SPECIAL_CHARS))
            else:
                cp = self.rng.randint(0x80, 0x10FFFF)
                while 0xD800 <= cp <= 0xDFFF:
                    cp = self.rng.randint(0x80, 0x10FFFF)
                out.append(chr(cp))
        return "".join(out)

    def bytes_(self) -> bytes:
        r = self.rng.random()
        if r < 0.15:
            return b""
        if r < 0.2:
            return self.rng.randbytes(self.rng.randint(200, 4000))
        if r < 0.3:
            return self.rng.choice([b"\x00", b"\xff", b"\x80", b"\x00\x00", b"\xff\xfe\xfd", b"="])
        return self.rng.randbytes(self.rng.randint(1, 40))

    def enum_value(self, fd: FieldDescriptor) -> int:
        values = [v.number for v in fd.enum_type.values]
        if not fd.enum_type.is_closed and self.rng.random() < 0.2:
            # Open enum: unknown numbers are legal values.
            return self.rng.choice([-(1 << 31), (1 << 31) - 1, -2, 3, 1000, self.integer(F.TYPE_INT32)])
        return self.rng.choice(values)

    def scalar(self, fd: FieldDescriptor):
        t = fd.type
        if t in INT_RANGES:
            return self.integer(t)
        if t == F.TYPE_FLOAT:
            return self.float32()
        if t == F.TYPE_DOUBLE:
            return self.float64()
        if t == F.TYPE_BOOL:
            return self.rng.random() < 0.5
        if t == F.TYPE_STRING:
            return self.string()
        if t == F.TYPE_BYTES:
            return self.bytes_()
        if t == F.TYPE_ENUM:
            return self.enum_value(fd)
        raise AssertionError(f"not a scalar: {fd.full_name}")

    def map_key(self, fd: FieldDescriptor):
        if self.rng.random() < 0.15:  # default-valued keys
            return {F.TYPE_STRING: "", F.TYPE_BOOL: False}.get(fd.type, 0)
        return self.scalar(fd)

    def repeat_count(self, depth: int, is_message: bool) -> int:
        r = self.rng.random()
        if r < 0.45 or self.budget <= 0:
            return 0
        if is_message:
            n = self.rng.randint(1, 3) if depth < self.max_depth - 1 else 0
        elif r < 0.8:
            n = self.rng.randint(1, 4)
        elif r < 0.95:
            n = self.rng.randint(5, 30)
        else:
            n = self.rng.randint(100, 400)
        return min(n, self.budget)

    # -- messages --------------------------------------------------------
    def message(self, cls, depth: int = 0):
        """A random message.  A per-message budget of values keeps recursive
        types (e.g. maps of maps) from growing without bound."""
        self.budget = self.rng.choice([10, 60, 300, 1200])
        msg = cls()
        self.fill(msg, depth)
        return msg

    def fill(self, msg, depth: int) -> None:
        desc = msg.DESCRIPTOR
        density = self.rng.choice([0.1, 0.3, 0.6, 0.9])
        oneof_members = set()
        for oneof in desc.oneofs:
            if oneof.full_name in self.schema.synthetic_oneofs:
                continue
            oneof_members.update(f.name for f in oneof.fields)
            if self.rng.random() < 0.6 and self.budget > 0:
                self.set_singular(msg, self.rng.choice(oneof.fields), depth)
        for fd in desc.fields:
            if fd.name in oneof_members:
                continue
            if fd.is_required:  # always set, whatever the budget
                self.set_singular(msg, fd, depth, force=True)
            elif self.budget <= 0 or self.rng.random() >= density:
                continue
            elif is_map_field(fd):
                self.fill_map(msg, fd, depth)
            elif fd.is_repeated:
                is_msg = fd.type in MESSAGE_TYPES
                for _ in range(self.repeat_count(depth, is_msg)):
                    self.budget -= 1
                    if is_msg:
                        self.fill(getattr(msg, fd.name).add(), depth + 1)
                    else:
                        getattr(msg, fd.name).append(self.scalar(fd))
            else:
                self.set_singular(msg, fd, depth)

    def set_singular(self, msg, fd: FieldDescriptor, depth: int, force: bool = False) -> None:
        self.budget -= 1
        if fd.type in MESSAGE_TYPES:
            if depth >= self.max_depth and not force:
                return
            sub = getattr(msg, fd.name)
            self.fill(sub, depth + 1)
            sub.SetInParent()
        else:
            setattr(msg, fd.name, self.scalar(fd))

    def fill_map(self, msg, fd: FieldDescriptor, depth: int) -> None:
        key_fd = fd.message_type.fields_by_name["key"]
        val_fd = fd.message_type.fields_by_name["value"]
        is_msg = val_fd.type == F.TYPE_MESSAGE
        if is_msg and depth >= self.max_depth - 1:
            return
        container = getattr(msg, fd.name)
        for _ in range(self.repeat_count(depth, is_msg)):
            self.budget -= 1
            key = self.map_key(key_fd)
            if is_msg:
                entry = container[key]
                if self.rng.random() < 0.8:
                    self.fill(entry, depth + 1)
            elif self.rng.random() < 0.15:  # default-valued value
                container[key] = (val_fd.enum_type.values[0].number if val_fd.type == F.TYPE_ENUM else
                                  {F.TYPE_STRING: "", F.TYPE_BYTES: b"", F.TYPE_BOOL: False,
                                   F.TYPE_FLOAT: 0.0, F.TYPE_DOUBLE: 0.0}.get(val_fd.type, 0))
            else:
                container[key] = self.scalar(val_fd)


def scalar_record(fd: FieldDescriptor, value, num: Optional[int] = None) -> Rec:
    """Encode one Python value of a scalar field as a wire record."""
    num = fd.number if num is None else num
    t = fd.type
    if t in (F.TYPE_INT32, F.TYPE_INT64, F.TYPE_ENUM):
        return Rec(num, VARINT, value & MASK64, fd=fd)
    if t in (F.TYPE_UINT32, F.TYPE_UINT64):
        return Rec(num, VARINT, value, fd=fd)
    if t == F.TYPE_BOOL:
        return Rec(num, VARINT, int(value), fd=fd)
    if t == F.TYPE_SINT32:
        return Rec(num, VARINT, ((value << 1) ^ (value >> 31)) & MASK32, fd=fd)
    if t == F.TYPE_SINT64:
        return Rec(num, VARINT, ((value << 1) ^ (value >> 63)) & MASK64, fd=fd)
    if t in STRUCT_FORMATS:
        return Rec(num, natural_wire_type(fd), struct.pack(STRUCT_FORMATS[t], value), fd=fd)
    if t == F.TYPE_STRING:
        return Rec(num, LEN, value.encode("utf-8"), fd=fd)
    if t == F.TYPE_BYTES:
        return Rec(num, LEN, value, fd=fd)
    raise AssertionError(f"not a scalar: {fd.full_name}")


# ---------------------------------------------------------------------------
# Wire-level rewriter
# ---------------------------------------------------------------------------

# Rewrites that keep the message's meaning: Python must parse the result to
# exactly the original message.
PRESERVING = ["shuffle", "repack", "dup_scalar", "oneof_switch", "split_message",
              "map_dup_key", "map_omit_default", "empty_packed", "overlong"]
# Adds unknown fields (outside map entries): equal to the original once
# unknown fields are discarded.
UNKNOWN_ONLY = ["unknown"]
# Rewrites that change the meaning; the expected output is whatever Python
# makes of them.
CHANGING = ["wrong_wire_type", "closed_enum_unknown", "high_bits", "nan_payload"]
# Behaviour the specification leaves open; only with --gray-areas.  upb keeps
# a map entry that contains unknown fields (or a key/value with the wrong wire
# type) as an unknown field of the map's parent, re-serialized (key and value
# only if present, nested maps in upb's own order), instead of inserting it
# into the map; Go, for one, drops the entry's unknown fields and inserts it.
GRAY = ["unknown_in_map_entry"]
# Usually malformed; Python decides.
MALFORMED = ["truncate", "truncate_nested", "bad_wire_type", "field_zero", "len_overrun",
             "varint_overflow", "stray_end_group", "open_group", "mismatched_end_group",
             "bad_utf8", "field_number_too_large", "overlong_tag"]
# Where protoplane follows protobuf C++ rather than upb (the Python oracle),
# so the expectation is C++'s, not Python's verdict:
# * a length prefix padded past five bytes is malformed (C++'s ReadSize takes
#   at most five bytes; upb reads ten and only checks the value);
# * an undeclared value of a packed closed enum goes to the unknown fields
#   with the 64 bits the sender wrote (C++ writes the int32 sign-extended,
#   the same bytes for the sign-extended values the rewriter sends; upb
#   re-encodes only the low 32 bits, so -2 would read back as 4294967294).
# Mutator.overlong_length and cpp_closed_enums() make those expectations.


class Mutator:
    def __init__(self, rng: random.Random, schema: Schema, gen: Generator):
        self.rng = rng
        self.schema = schema
        self.gen = gen

    # -- helpers -------------------------------------------------------
    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def unused_number(self, desc: Optional[Descriptor]) -> int:
        while True:
            r = self.rng.random()
            if r < 0.5:
                num = self.rng.randint(1, 200)
            elif r < 0.8:
                num = self.rng.randint(201, 1 << 20)
            elif r < 0.9:
                num = self.rng.randint(1 << 20, MAX_FIELD_NUMBER)
            else:
                num = self.rng.choice([15, 16, 2047, 2048, MAX_FIELD_NUMBER, MAX_FIELD_NUMBER - 1])
            if num in RESERVED_NUMBERS:
                continue
            if desc is None or num not in desc.fields_by_number:
                return num

    def unknown_record(self, desc: Optional[Descriptor], depth: int = 0) -> Rec:
        num = self.unused_number(desc)
        wt = self.rng.choice([VARINT, I64, LEN, I32, SGROUP] if depth < 3 else [VARINT, I64, LEN, I32])
        if wt == VARINT:
            value = self.rng.choice([0, 1, MASK64, MASK32, 1 << 63, self.rng.getrandbits(self.rng.randint(1, 64))])
            return Rec(num, VARINT, value)
        if wt == I64:
            return Rec(num, I64, self.rng.randbytes(8))
        if wt == I32:
            return Rec(num, I32, self.rng.randbytes(4))
        if wt == LEN:
            if self.chance(0.5):
                return Rec(num, LEN, self.rng.randbytes(self.rng.randint(0, 20)))
            body = [self.unknown_record(None, depth + 1) for _ in range(self.rng.randint(0, 3))]
            return Rec(num, LEN, encode_records(body))
        body = [self.unknown_record(None, depth + 1) for _ in range(self.rng.randint(0, 3))]
        return Rec(num, SGROUP, children=body)

    def field_record(self, fd: FieldDescriptor) -> Rec:
        """A random, valid record for a known singular (or map-entry) field."""
        if fd.type in MESSAGE_TYPES:
            cls = self.schema.message_class(fd.message_type)
            sub = Generator(self.rng, self.schema, max_depth=2).message(cls, depth=0)
            children = parse_records(sub.SerializeToString(deterministic=True), fd.message_type)
            return Rec(fd.number, natural_wire_type(fd), children=children, fd=fd)
        value = self.gen.scalar(fd)
        if fd.type == F.TYPE_ENUM and not fd.enum_type.is_closed and self.chance(0.5):
            value = self.rng.choice(fd.enum_type.values).number
        return scalar_record(fd, value)

    # -- the rewrite ---------------------------------------------------
    def mutate(self, recs: list[Rec], desc: Descriptor, plan: set) -> list[Rec]:
        recs = self._level(recs, desc, plan, in_map_entry=False)
        if "overlong" in plan:
            self.make_overlong(recs)
        return recs

    def _level(self, recs: list[Rec], desc: Descriptor, plan: set, in_map_entry: bool) -> list[Rec]:
        # Recurse first, so that nested levels are rewritten independently.
        for rec in recs:
            if rec.children is not None and rec.fd is not None:
                rec.children = self._level(rec.children, rec.fd.message_type, plan,
                                           in_map_entry=is_map_entry(rec.fd.message_type))
        p = 0.5
        if "shuffle" in plan and self.chance(p):
            recs = self.shuffle(recs)
        if "repack" in plan and self.chance(p):
            recs = self.repack(recs)
        if "dup_scalar" in plan:
            recs = self.dup_scalar(recs)
        if "oneof_switch" in plan and not in_map_entry:
            recs = self.oneof_switch(recs, desc)
        if "split_message" in plan:
            recs = self.split_message(recs)
        if "map_dup_key" in plan:
            recs = self.map_dup_key(recs)
        if "map_omit_default" in plan and in_map_entry:
            recs = self.map_omit_default(recs)
        if "empty_packed" in plan and self.chance(0.3):
            recs = self.empty_packed(recs, desc)
        if ("unknown" in plan and not in_map_entry) or ("unknown_in_map_entry" in plan and in_map_entry):
            for _ in range(self.rng.randint(0, 3) if self.chance(p) else 0):
                recs.insert(self.rng.randint(0, len(recs)), self.unknown_record(desc))
        if "wrong_wire_type" in plan and (not in_map_entry or "unknown_in_map_entry" in plan):
            recs = self.wrong_wire_type(recs)
        if "closed_enum_unknown" in plan:
            self.closed_enum_unknown(recs, in_map_entry)
        if "high_bits" in plan:
            self.high_bits(recs)
        if "nan_payload" in plan:
            self.nan_payload(recs)
        return recs

    def shuffle(self, recs: list[Rec]) -> list[Rec]:
        """Reorder records of different field numbers.  Records with the same
        number keep their relative order, and so do all unknown fields."""
        keys = {}
        for rec in recs:
            group = rec.num if rec.fd is not None else -1
            keys.setdefault(group, self.rng.random())
        return sorted(recs, key=lambda r: keys[r.num if r.fd is not None else -1])

    def repack(self, recs: list[Rec]) -> list[Rec]:
        """Re-chunk repeated scalars into a random mix of packed and unpacked
        records (their element order is kept)."""
        by_num = {}
        for rec in recs:
            if is_packable(rec.fd):
                by_num.setdefault(rec.num, []).append(rec)
        out = list(recs)
        for num, group in by_num.items():
            fd = group[0].fd
            elems = []
            for rec in group:
                elems.extend(rec.elems if rec.wt == LEN else [Rec(0, rec.wt, rec.value, fd=fd, pad=rec.pad)])
            chunks, i = [], 0
            while i < len(elems):
                n = self.rng.randint(1, max(1, len(elems) - i))
                part = elems[i:i + n]
                i += n
                if self.chance(0.5):
                    chunks.append(Rec(num, LEN, elems=part, fd=fd))
                else:
                    chunks.extend(Rec(num, e.wt, e.value, fd=fd, pad=e.pad) for e in part)
            first = next(i for i, r in enumerate(out) if r is group[0])
            members = {id(r) for r in group}
            out = [r for r in out if id(r) not in members]
            out[first:first] = chunks
        return out

    def dup_scalar(self, recs: list[Rec]) -> list[Rec]:
        """Insert an earlier occurrence with another value before singular
        scalars: the later one wins."""
        out = []
        for rec in recs:
            fd = rec.fd
            if (fd is not None and not fd.is_repeated and fd.type not in MESSAGE_TYPES
                    and self.chance(0.3)):
                out.append(self.field_record(fd))
            out.append(rec)
        return out

    def oneof_switch(self, recs: list[Rec], desc: Descriptor) -> list[Rec]:
        """Before a set oneof member, insert another member of the same oneof
        (a later member clears an earlier one)."""
        for oneof in desc.oneofs:
            if oneof.full_name in self.schema.synthetic_oneofs or len(oneof.fields) < 2:
                continue
            numbers = {f.number for f in oneof.fields}
            idx = next((i for i, r in enumerate(recs) if r.fd is not None and r.num in numbers), None)
            if idx is None or not self.chance(0.6):
                continue
            other = self.rng.choice([f for f in oneof.fields if f.number != recs[idx].num])
            recs.insert(idx, self.field_record(other))
        return recs

    def split_message(self, recs: list[Rec]) -> list[Rec]:
        """Split a singular sub-message or group into two occurrences."""
        out = []
        for rec in recs:
            fd = rec.fd
            if (fd is not None and fd.type in MESSAGE_TYPES and not fd.is_repeated
                    and rec.children is not None and self.chance(0.4)):
                cut = self.rng.randint(0, len(rec.children))
                out.append(Rec(rec.num, rec.wt, children=rec.children[:cut], fd=fd))
                out.append(Rec(rec.num, rec.wt, children=rec.children[cut:], fd=fd))
            else:
                out.append(rec)
        return out

    def map_dup_key(self, recs: list[Rec]) -> list[Rec]:
        """Before a map entry, insert an entry with the same key and another
        value (or no value): the later entry wins."""
        out = []
        for rec in recs:
            if is_map_field(rec.fd) and rec.children is not None and self.chance(0.3):
                entry_desc = rec.fd.message_type
                keys = [c for c in rec.children if c.num == 1 and c.fd is not None]
                body = [dataclasses.replace(k) for k in keys[-1:]]  # the key that counts
                if self.chance(0.7):
                    body.append(self.field_record(entry_desc.fields_by_number[2]))
                if self.chance(0.5):
                    body.reverse()
                out.append(Rec(rec.num, LEN, children=body, fd=rec.fd))
            out.append(rec)
        return out

    def map_omit_default(self, recs: list[Rec]) -> list[Rec]:
        """Drop default-valued key/value records from a map entry."""
        def is_default(rec: Rec) -> bool:
            if rec.wt == VARINT:
                return rec.value == 0
            if rec.wt in (I32, I64):
                return rec.value.strip(b"\0") == b""  # all-zero bits (so not -0.0)
            if rec.wt == LEN and rec.children is not None:
                return not rec.children
            return rec.wt == LEN and rec.value == b""
        counts = {}
        for r in recs:
            counts[r.num] = counts.get(r.num, 0) + 1
        return [r for r in recs if not (r.fd is not None and counts[r.num] == 1 and is_default(r)
                                        and self.chance(0.7))]

    def empty_packed(self, recs: list[Rec], desc: Descriptor) -> list[Rec]:
        """Insert a zero-length packed record for a repeated scalar."""
        candidates = [f for f in desc.fields if is_packable(f)]
        if candidates:
            fd = self.rng.choice(candidates)
            recs.insert(self.rng.randint(0, len(recs)), Rec(fd.number, LEN, elems=[], fd=fd))
        return recs

    def wrong_wire_type(self, recs: list[Rec]) -> list[Rec]:
        """Replace a known field's wire type by one the field does not accept;
        the record becomes an unknown field.  Required fields are left alone
        (making them unknown would leave the message uninitialized)."""
        for i, rec in enumerate(recs):
            fd = rec.fd
            if fd is None or fd.is_required or not self.chance(0.2):
                continue
            accepted = {natural_wire_type(fd)} | ({LEN} if is_packable(fd) else set())
            if fd.type == F.TYPE_GROUP and fd.is_repeated:
                # upb quirk: it rejects a LEN record for a repeated group
                # (for an optional group it keeps it as an unknown field).
                accepted.add(LEN)
            wt = self.rng.choice([w for w in (VARINT, I64, LEN, I32, SGROUP) if w not in accepted])
            bogus = {VARINT: Rec(rec.num, VARINT, self.rng.getrandbits(20)),
                     I64: Rec(rec.num, I64, self.rng.randbytes(8)),
                     I32: Rec(rec.num, I32, self.rng.randbytes(4)),
                     LEN: Rec(rec.num, LEN, self.rng.randbytes(self.rng.randint(0, 6))),
                     SGROUP: Rec(rec.num, SGROUP, children=[])}[wt]
            recs[i] = bogus
        return recs

    def _scalar_targets(self, recs: list[Rec]):
        """Known scalar records of this level, with packed elements."""
        for rec in recs:
            if rec.fd is None:
                continue
            if rec.elems is not None:
                yield from rec.elems
            elif rec.children is None and rec.wt != LEN:
                yield rec

    def closed_enum_unknown(self, recs: list[Rec], in_map_entry: bool) -> None:
        """Give closed-enum fields a number outside the enum.  Python keeps
        such values as unknown fields (for map values: the whole entry)."""
        for rec in self._scalar_targets(recs):
            fd = rec.fd
            if (fd.type == F.TYPE_ENUM and fd.enum_type.is_closed and not fd.is_required
                    and self.chance(0.4)):
                known = {v.number for v in fd.enum_type.values}
                value = self.rng.choice([2, 3, 99, -2, -100, 1 << 20])
                if value not in known:
                    rec.value = value & MASK64

    def high_bits(self, recs: list[Rec]) -> None:
        """Set bits 32..63 of 32-bit varints (parsers truncate to 32 bits;
        bools are true for any non-zero value)."""
        for rec in self._scalar_targets(recs):
            fd = rec.fd
            if (fd.type == F.TYPE_ENUM and fd.enum_type.is_closed
                    and to_int32(rec.value) not in {v.number for v in fd.enum_type.values}):
                # An undeclared closed-enum value with arbitrary high bits
                # has three readings: upb keeps the low 32 bits, C++ their
                # sign extension, protoplane all 64 bits as sent.  Only the
                # sign-extended form, which all agree on, is sent.
                continue
            if fd.type in NARROW_VARINT_TYPES and self.chance(0.4):
                high = self.rng.choice([0, 1, 0xFFFFFFFF, self.rng.getrandbits(32)])
                if rec.fd.type == F.TYPE_BOOL:
                    rec.value = rec.value | (high << 32) if rec.value else rec.value
                else:
                    rec.value = (rec.value & MASK32) | (high << 32)

    def nan_payload(self, recs: list[Rec]) -> None:
        """Replace floats by NaNs with random payload and sign."""
        for rec in self._scalar_targets(recs):
            if rec.fd.type == F.TYPE_FLOAT and self.chance(0.4):
                bits = 0x7F800000 | self.rng.randint(1, (1 << 23) - 1) | (self.rng.getrandbits(1) << 31)
                rec.value = struct.pack("<I", bits)
            elif rec.fd.type == F.TYPE_DOUBLE and self.chance(0.4):
                bits = 0x7FF0000000000000 | self.rng.randint(1, (1 << 52) - 1) | (self.rng.getrandbits(1) << 63)
                rec.value = struct.pack("<Q", bits)

    def make_overlong(self, recs: list[Rec]) -> None:
        """Pad varint values to at most 10 bytes, tags and lengths to at most
        5 (protobuf C++ rejects longer tags and lengths, upb longer tags)."""
        for rec in walk(recs):
            if rec.wt == VARINT and self.chance(0.3):
                room = 10 - varint_size(rec.value)
                rec.pad = self.rng.randint(1, room) if room > 0 else 0
            if rec.wt != RAW and rec.num and self.chance(0.1):
                room = 5 - varint_size(rec.num << 3)
                rec.tag_pad = self.rng.randint(1, room) if room > 0 else 0
        # Lengths last and innermost first: padding inside a payload changes
        # the length that its prefix has to encode.
        for rec in reversed(list(walk(recs))):
            if rec.wt == LEN and self.chance(0.3):
                room = 5 - varint_size(len(len_payload(rec)))
                rec.len_pad = self.rng.randint(1, room) if room > 0 else 0

    # -- malformed inputs ----------------------------------------------
    def malformed(self, recs: list[Rec], desc: Descriptor, schema: Schema) -> tuple[bytes, str]:
        """Return (bytes, kind) for a probably-malformed variant."""
        kind = self.rng.choice(MALFORMED)
        levels = list(message_levels(recs, desc))
        level, level_desc = self.rng.choice(levels)
        pos = self.rng.randint(0, len(level))
        if kind == "truncate":
            data = encode_records(recs)
            if len(data) > 1:
                return data[:self.rng.randint(1, len(data) - 1)], kind
            kind = "bad_wire_type"
        if kind == "truncate_nested":
            subs = [r for r in walk(recs) if r.wt == LEN and r.children]
            if subs:
                victim = self.rng.choice(subs)
                data = encode_records(victim.children)
                victim.value, victim.children = data[:self.rng.randint(0, len(data) - 1)], None
                return encode_records(recs), kind
            kind = "bad_wire_type"
        if kind == "bad_utf8":
            strings = [r for r in walk(recs) if r.fd is not None and r.fd.type == F.TYPE_STRING
                       and r.wt == LEN and schema.is_proto3(r.fd.containing_type)]
            if strings:
                victim = self.rng.choice(strings)
                bad = self.rng.choice([b"\xff", b"\xc3", b"\xc0\x80", b"\xed\xa0\x80",
                                       b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80abc"])
                cut = self.rng.randint(0, len(victim.value))
                victim.value = victim.value[:cut] + bad + victim.value[cut:]
                return encode_records(recs), kind
            kind = "bad_wire_type"
        num = self.unused_number(level_desc)
        junk = {
            "bad_wire_type": lambda: encode_varint(num << 3 | self.rng.choice([6, 7])) + b"\x01\x02",
            "field_zero": lambda: encode_varint(self.rng.choice([VARINT, I32, LEN])) + b"\x00\x00\x00\x00",
            "len_overrun": lambda: encode_varint(num << 3 | LEN) + encode_varint(self.rng.randint(1, 1 << 31)) + b"ab",
            "varint_overflow": lambda: encode_varint(num << 3) + b"\xff" * 10 + b"\x01",
            "stray_end_group": lambda: encode_varint(num << 3 | EGROUP),
            "open_group": lambda: encode_varint(num << 3 | SGROUP) + encode_varint((num + 1) << 3) + b"\x05",
            "mismatched_end_group": lambda: (encode_varint(num << 3 | SGROUP)
                                             + encode_varint((num + 1 if num < MAX_FIELD_NUMBER else num - 1) << 3 | EGROUP)),
            "field_number_too_large": lambda: encode_varint(self.rng.randint(1 << 29, 1 << 32) << 3) + b"\x01",
            # A valid tag padded to 6..10 bytes: both C++ and upb reject it.
            "overlong_tag": lambda: (encode_varint(num << 3, self.rng.randint(6, 10) - varint_size(num << 3))
                                     + b"\x01"),
        }[kind]()
        level.insert(pos, raw(junk))
        return encode_records(recs), kind

    def overlong_length(self, recs: list[Rec]) -> Optional[bytes]:
        """One length prefix padded to 6..10 bytes (see the note on protobuf
        C++ semantics beside MALFORMED), or
        None when the message has no length-delimited record."""
        lens = [r for r in walk(recs) if r.wt == LEN]
        if not lens:
            return None
        victim = self.rng.choice(lens)
        size = varint_size(len(len_payload(victim)))
        victim.len_pad = self.rng.randint(6, 10) - size
        return encode_records(recs)


def to_int32(value: int) -> int:
    """The int32 a varint's low 32 bits read as."""
    value &= MASK32
    return value - (1 << 32) if value >= 1 << 31 else value


def cpp_closed_enums(data: bytes, desc: Descriptor) -> bytes:
    """Python's output with the undeclared packed closed-enum values that upb
    cut to 32 bits widened back to the sign-extended 64 bits the rewriter
    sent (see the note beside MALFORMED).  upb writes such a value as a varint record of
    the enum's field number with a value in [2^31, 2^32); a declared value
    never takes that form (upb writes a negative one sign-extended), nor
    does an unpacked undeclared one (upb keeps its bytes as they came)."""
    changed = False
    for rec in walk(recs := parse_records(data, desc)):
        fd = rec.fd
        if (rec.wt == VARINT and fd is not None and fd.type == F.TYPE_ENUM
                and fd.enum_type.is_closed and (1 << 31) <= rec.value < (1 << 32) and not rec.pad):
            rec.value = (rec.value - (1 << 32)) & MASK64
            changed = True
    return encode_records(recs) if changed else data


# ---------------------------------------------------------------------------
# Python oracle
# ---------------------------------------------------------------------------

REJECT = "reject"


def python_roundtrip(cls, data: bytes):
    """Python's verdict: re-encoded bytes, REJECT, or None when Python parses
    the input but cannot serialize it (missing required fields)."""
    try:
        msg = cls.FromString(data)
    except DecodeError:
        return REJECT
    try:
        return msg.SerializeToString(deterministic=True)
    except EncodeError:
        return None


def map_key_sort_value(entry: Rec):
    """Sort key of a map entry record: the key's value compared the way C++,
    Java and Go order deterministic output (signed types signed, unsigned
    types unsigned, false < true, strings bytewise, shorter prefix first)."""
    key_fd = entry.fd.message_type.fields_by_number[1]
    keys = [c for c in entry.children if c.num == 1 and c.fd is not None]
    if not keys:
        return b"" if key_fd.type == F.TYPE_STRING else 0
    rec = keys[-1]
    t = key_fd.type
    if t == F.TYPE_STRING:
        return rec.value
    if t in STRUCT_FORMATS:
        return struct.unpack(STRUCT_FORMATS[t], rec.value)[0]
    value = rec.value
    if t in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_UINT32):
        value &= MASK32
    if t in (F.TYPE_SINT32, F.TYPE_SINT64):
        return (value >> 1) ^ -(value & 1)
    if t == F.TYPE_INT32:
        return value - (1 << 32) if value >> 31 else value
    if t == F.TYPE_INT64:
        return value - (1 << 64) if value >> 63 else value
    if t == F.TYPE_BOOL:
        return int(value != 0)
    return value


def ascending_map_order(full: bytes, stripped: bytes, desc: Descriptor) -> bytes:
    """Re-order the map entries of Python's deterministic output by ascending
    key.

    upb, which backs the Python package, writes deterministic map entries in
    an order of its own (integer keys in descending unsigned order; strings
    ascending, except that a string precedes its own prefixes), unlike
    C++, Java and Go, which sort ascending by key.  Deterministic output is
    not specified across implementations, so protoplane is held to the
    common ascending order.  ``stripped`` is the same message serialized
    without unknown fields: at every level the known records come first, and
    only those are re-ordered (map entries that Python keeps as unknown
    fields stay where they are)."""
    def fix(full_recs: list[Rec], known_recs: list[Rec]) -> list[Rec]:
        k = len(known_recs)
        head = full_recs[:k]
        for rec, known in zip(head, known_recs):
            if rec.children is not None and rec.fd is not None and known.children is not None:
                rec.children = fix(rec.children, known.children)
        out, i = [], 0
        while i < len(head):
            j = i
            while j < len(head) and head[j].num == head[i].num:
                j += 1
            run = head[i:j]
            if is_map_field(run[0].fd) and all(r.children is not None for r in run):
                run = sorted(run, key=map_key_sort_value)
            out.extend(run)
            i = j
        return out + full_recs[k:]

    recs = fix(parse_records(full, desc), parse_records(stripped, desc))
    result = encode_records(recs)
    assert len(result) == len(full)
    return result


class Oracle:
    """Python's verdict on inputs, with deterministic map order normalized
    to ascending keys unless ``python_map_order`` is set."""

    def __init__(self, python_map_order: bool = False):
        self.python_map_order = python_map_order

    def normalize(self, cls, data: bytes) -> bytes:
        if self.python_map_order:
            return data
        msg = cls.FromString(data)
        msg.DiscardUnknownFields()
        return ascending_map_order(data, msg.SerializeToString(deterministic=True), cls.DESCRIPTOR)


def python_json(cls, data: bytes):
    try:
        return json_format.MessageToJson(cls.FromString(data))
    except Exception:  # noqa: BLE001 - anything Python cannot print is skipped
        return None


FLT_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]
FLT_MAX_PRINTED = 3.4028235e38


def json_expectation(cls, line: str, oracle: Oracle) -> Optional[bytes]:
    """What `encode` must produce for one of Python's JSON lines.

    Python's own parse of the line, with one work-around: Python's json_format
    refuses the +-FLT_MAX it prints itself ("3.4028235e+38" is above FLT_MAX
    as a double, although it rounds to FLT_MAX as a float), so that number is
    replaced by the exact double value of FLT_MAX before Python parses it.
    Returns None if Python still cannot parse the line.
    """
    def fix(value):
        if isinstance(value, float) and abs(value) == FLT_MAX_PRINTED:
            return math.copysign(FLT_MAX, value)
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        return value
    try:
        data = json_format.ParseDict(fix(json.loads(line)), cls()).SerializeToString(deterministic=True)
    except json_format.ParseError:
        return None
    return oracle.normalize(cls, data)


def json_diff(expected, actual, path: str = "$") -> Optional[str]:
    """First semantic difference between two parsed JSON values, or None."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        if type(expected) is not type(actual) or expected != actual:
            return f"{path}: expected {expected!r}, got {actual!r}"
        return None
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        if isinstance(expected, float) or isinstance(actual, float):
            if float_equal(float(expected), float(actual)):
                return None
        elif expected == actual:
            return None
        return f"{path}: expected {expected!r}, got {actual!r}"
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in expected.keys() | actual.keys():
            if key not in actual:
                return f"{path}: missing key {key!r}"
            if key not in expected:
                return f"{path}: unexpected key {key!r}"
            diff = json_diff(expected[key], actual[key], f"{path}.{key}")
            if diff:
                return diff
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return f"{path}: expected {len(expected)} elements, got {len(actual)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            diff = json_diff(e, a, f"{path}[{i}]")
            if diff:
                return diff
        return None
    if type(expected) is not type(actual) or expected != actual:
        return f"{path}: expected {expected!r}, got {actual!r}"
    return None


def describe_record(rec: Optional[Rec]) -> str:
    if rec is None:
        return "nothing"
    name = rec.fd.name if rec.fd is not None else "unknown"
    return f"field {rec.num} ({name}) wire type {rec.wt}: {encode_record(rec)[:48].hex()}"


def wire_diff(expected: bytes, actual: bytes, desc: Descriptor) -> str:
    """Locate the first difference between two encodings, for reports."""
    try:
        exp_recs = parse_records(expected, desc)
    except ValueError:
        return "expected bytes do not parse"
    try:
        act_recs = parse_records(actual, desc)
    except ValueError as exc:
        return f"actual bytes do not parse: {exc}"

    def diff(exp: list[Rec], act: list[Rec], path: str) -> Optional[str]:
        for i in range(max(len(exp), len(act))):
            e = exp[i] if i < len(exp) else None
            a = act[i] if i < len(act) else None
            if e is not None and a is not None and (e.num, e.wt) == (a.num, a.wt):
                if e.children is not None and a.children is not None:
                    name = e.fd.name if e.fd is not None else str(e.num)
                    found = diff(e.children, a.children, f"{path}.{name}[record {i}]")
                    if found:
                        return found
                    continue
                if encode_record(e) == encode_record(a):
                    continue
            return f"record {i} of {path}: expected {describe_record(e)}; got {describe_record(a)}"
        return None

    return diff(exp_recs, act_recs, "$") or "no difference"


def float_equal(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    if math.isclose(a, b, rel_tol=1e-6):
        return True
    try:  # the same float32 value printed with different precision
        return struct.pack("<f", a) == struct.pack("<f", b)
    except OverflowError:
        return False


# ---------------------------------------------------------------------------
# Test cases
# ---------------------------------------------------------------------------

@dataclass
class Case:
    data: bytes
    origin: str  # "canonical", "mutated[kinds]", "malformed[kind]"
    expected: object = None  # bytes, or REJECT


@dataclass
class TypeCorpus:
    proto: str
    type_name: str
    cls: object
    accepted: list[Case] = field(default_factory=list)
    rejected: list[Case] = field(default_factory=list)
    json_lines: list[tuple[str, bytes, str]] = field(default_factory=list)  # (line, expected, origin)
    json_skipped: int = 0


class SelfCheck:
    """Harness self-check failures (bugs in this script, not in protoplane)."""

    def __init__(self):
        self.errors: list[str] = []
        self.passed = 0

    def check(self, ok: bool, what: str) -> None:
        if ok:
            self.passed += 1
        else:
            self.errors.append(what)
            if len(self.errors) <= 10:
                print(f"HARNESS SELF-CHECK FAILED: {clip(what, 600)}", file=sys.stderr)


def build_corpus(schema: Schema, proto: str, type_name: str, count: int, seed: int,
                 selfcheck: SelfCheck, max_rejects: int, oracle: Oracle,
                 gray_areas: bool = False) -> TypeCorpus:
    """Generate `count` random messages of one type, and from each a
    rewritten variant and sometimes a malformed one, with Python's verdicts."""
    rng = random.Random(f"{seed}:{type_name}")
    cls = schema.classes[type_name]
    desc = cls.DESCRIPTOR
    gen = Generator(rng, schema)
    mut = Mutator(rng, schema, gen)
    corpus = TypeCorpus(proto, type_name, cls)
    mutated: list[Case] = []
    for i in range(count):
        msg = gen.message(cls)
        canonical = msg.SerializeToString(deterministic=True)
        # The rewriter's parser must re-encode canonical bytes exactly.
        selfcheck.check(encode_records(parse_records(canonical, desc)) == canonical,
                        f"{type_name}: parse/encode is not the identity on {canonical.hex()}")
        selfcheck.check(python_roundtrip(cls, canonical) == canonical,
                        f"{type_name}: Python does not round-trip its own output {canonical.hex()}")
        expected = oracle.normalize(cls, canonical)
        selfcheck.check(python_roundtrip(cls, expected) == canonical,
                        f"{type_name}: map re-ordering changed the message {canonical.hex()}")
        corpus.accepted.append(Case(canonical, "canonical", expected))

        # JSON line for `encode`; alternate ASCII-escaped and raw UTF-8.
        line = json_format.MessageToJson(msg, indent=None, ensure_ascii=(i % 2 == 0))
        expected = json_expectation(cls, line, oracle)
        if expected is None:
            corpus.json_skipped += 1
        else:
            corpus.json_lines.append((line, expected, "canonical"))

        # One rewritten variant per message.
        r = rng.random()
        if r < 0.45:
            plan = set(rng.sample(PRESERVING, rng.randint(1, 4)))
        elif r < 0.65:
            plan = set(rng.sample(PRESERVING, rng.randint(0, 3))) | {"unknown"}
        else:
            plan = set(rng.sample(PRESERVING + UNKNOWN_ONLY, rng.randint(0, 3)))
            changing = CHANGING + GRAY if gray_areas else CHANGING
            plan |= set(rng.sample(changing, rng.randint(1, 2)))
        recs = mut.mutate(parse_records(canonical, desc), desc, plan)
        data = encode_records(recs)
        verdict = python_roundtrip(cls, data)
        origin = f"mutated[{','.join(sorted(plan))}]"
        if plan <= set(PRESERVING):
            selfcheck.check(verdict == canonical,
                            f"{type_name}: meaning-preserving rewrite {origin} changed the message:"
                            f" {canonical.hex()} -> {data.hex()}")
        elif plan <= set(PRESERVING) | {"unknown"} and verdict not in (REJECT, None):
            stripped = cls.FromString(data)
            stripped.DiscardUnknownFields()
            selfcheck.check(stripped.SerializeToString(deterministic=True) == canonical,
                            f"{type_name}: rewrite {origin} changed known fields:"
                            f" {canonical.hex()} -> {data.hex()}")
        if verdict == REJECT:
            selfcheck.check(False, f"{type_name}: Python rejected valid rewrite {origin}: {data.hex()}")
        elif verdict is not None:
            expected = oracle.normalize(cls, verdict)
            if "closed_enum_unknown" in plan:
                expected = cpp_closed_enums(expected, desc)
            mutated.append(Case(data, origin, expected))

        # Occasionally a malformed variant.
        if rng.random() < 0.15:
            data, kind = mut.malformed(parse_records(canonical, desc), desc, schema)
            verdict = python_roundtrip(cls, data)
            if verdict == REJECT:
                if len(corpus.rejected) < max_rejects:
                    corpus.rejected.append(Case(data, f"malformed[{kind}]", REJECT))
            elif verdict is not None:
                mutated.append(Case(data, f"malformed-but-accepted[{kind}]", oracle.normalize(cls, verdict)))
        # Occasionally an input upb accepts and protobuf C++ rejects.
        if rng.random() < 0.05 and len(corpus.rejected) < max_rejects:
            data = mut.overlong_length(parse_records(canonical, desc))
            if data is not None:
                corpus.rejected.append(Case(data, "cpp-semantics[overlong_length]", REJECT))
    corpus.accepted.extend(mutated)
    return corpus


# ---------------------------------------------------------------------------
# Running protoplane
# ---------------------------------------------------------------------------

@dataclass
class Failure:
    type_name: str
    mode: str
    index: int  # position in the batch; -1 for whole-batch problems
    origin: str  # how the input was made
    input: str  # hex of the wire input, or the JSON line for `encode`
    expected: str
    actual: str


class Runner:
    """Runs protoplane batches and tallies per-message results."""

    def __init__(self, binary: str, timeout: float, verbose_limit: int):
        self.binary = binary
        self.timeout = timeout
        self.verbose_limit = verbose_limit
        self.passed = 0
        self.failures: list[Failure] = []
        self.processes = 0

    def base_cmd(self, command: str, corpus: TypeCorpus) -> list[str]:
        return [self.binary, command, "--proto", os.path.join(PROTO_ROOT_REL, corpus.proto),
                "-I", PROTO_ROOT_REL, "--type", corpus.type_name]

    def run(self, cmd: list[str], stdin: bytes) -> tuple[Optional[int], bytes, bytes]:
        """Run one process; the exit status is None on time-out."""
        self.processes += 1
        try:
            proc = subprocess.run(cmd, input=stdin, capture_output=True, cwd=REPO, timeout=self.timeout)
        except subprocess.TimeoutExpired as exc:
            return None, exc.stdout or b"", f"timed out after {self.timeout:g}s".encode()
        return proc.returncode, proc.stdout, proc.stderr

    def fail(self, f: Failure) -> None:
        self.failures.append(f)
        if len(self.failures) <= self.verbose_limit:
            print(f"FAIL {f.type_name} {f.mode} #{f.index} {f.origin}")
            print(f"  input:    {clip(f.input)}")
            print(f"  expected: {clip(f.expected)}")
            print(f"  actual:   {clip(f.actual)}")

    def batch(self, corpus: TypeCorpus, mode: str, cmd: list[str], items: list,
              encode_in: Callable[[list], bytes],
              split_out: Callable[[bytes], tuple[list, Optional[str]]],
              compare: Callable[[object, object], Optional[str]],
              describe: Callable[[object], tuple[str, str, str]]) -> None:
        """Run one (type, mode) batch in a single process and compare outputs
        with expectations one by one.

        ``describe(item)`` gives (input, origin, expected) for reports.  If the
        process fails part-way (or gives too few outputs), the outputs it did
        give are still compared, and the rest of the batch is bisected in fresh
        processes until each failing input is isolated and charged with the
        failure.  The number of processes per batch is bounded.
        """
        budget = [100 + 2 * len(items)]

        def charge(index: int, actual: str) -> None:
            shown_input, origin, expected = describe(items[index])
            self.fail(Failure(corpus.type_name, mode, index, origin, shown_input, expected, actual))

        def resolve(lo: int, hi: int) -> None:
            if budget[0] <= 0:
                for index in range(lo, hi):
                    charge(index, "not run: too many failing processes in this batch")
                return
            budget[0] -= 1
            rc, out, err = self.run(cmd, encode_in(items[lo:hi]))
            stderr = err.decode("utf-8", "replace").strip()[:1000]
            outputs, split_err = split_out(out)
            for offset, actual in enumerate(outputs[:hi - lo]):
                diff = compare(items[lo + offset], actual)
                if diff is None:
                    self.passed += 1
                else:
                    charge(lo + offset, diff)
            done = lo + min(len(outputs), hi - lo)
            if done == hi:
                if rc != 0 or len(outputs) != hi - lo or split_err:
                    problem = (f"exit status {rc}" if rc != 0 else
                               split_err or f"{len(outputs) - (hi - lo)} extra outputs")
                    self.fail(Failure(corpus.type_name, mode, -1, "batch", f"(inputs {lo}..{hi - 1})",
                                      "exit status 0 and exactly one output per input",
                                      f"{problem}; stderr: {stderr}"))
                return
            if rc is None:
                for index in range(done, hi):
                    charge(index, f"not run: the process for inputs {lo}..{hi - 1} timed out")
                return
            if hi - done == 1:
                reason = f"exit status {rc}" + (f"; {split_err}" if split_err else "")
                charge(done, f"no output ({reason}); stderr: {stderr}")
                return
            mid = (done + hi + 1) // 2
            resolve(done, mid)
            resolve(mid, hi)

        resolve(0, len(items))

    def roundtrip(self, corpus: TypeCorpus, view: bool) -> None:
        cmd = self.base_cmd("roundtrip", corpus) + ["--delimited", "--deterministic"] + (["--view"] if view else [])
        mode = "roundtrip" + (" --view" if view else "")
        self.batch(corpus, mode, cmd, corpus.accepted,
                   encode_in=lambda cases: delimited([c.data for c in cases]),
                   split_out=split_delimited,
                   compare=lambda case, actual: None if actual == case.expected else
                   f"{actual.hex()}\n  first difference: {wire_diff(case.expected, actual, corpus.cls.DESCRIPTOR)}",
                   describe=lambda case: (case.data.hex(), case.origin, case.expected.hex()))

    def rejects(self, corpus: TypeCorpus, view: bool) -> None:
        cmd = self.base_cmd("roundtrip", corpus) + ["--deterministic"] + (["--view"] if view else [])
        mode = "reject" + (" --view" if view else "")
        for i, case in enumerate(corpus.rejected):
            rc, out, err = self.run(cmd, case.data)
            lines = err.decode("utf-8", "replace").rstrip("\n").split("\n")
            if rc == 1 and len(lines) == 1 and lines[0].strip():
                self.passed += 1
            else:
                self.fail(Failure(corpus.type_name, mode, i, case.origin, case.data.hex(),
                                  "exit status 1 and a one-line stderr (Python: DecodeError)",
                                  f"exit status {rc}, stdout {out[:200].hex()}, stderr {err[:300]!r}"))

    def decode(self, corpus: TypeCorpus) -> None:
        items = []
        for case in corpus.accepted:
            text = python_json(corpus.cls, case.data)
            if text is not None:
                items.append((case, json.loads(text)))
        cmd = self.base_cmd("decode", corpus) + ["--delimited"]

        def split_lines(out: bytes):
            text = out.decode("utf-8", "replace")
            lines = text.split("\n")  # not splitlines(): U+2028 may appear raw
            if lines and lines[-1] == "":
                lines.pop()
            return lines, None

        def compare(item, line):
            try:
                actual = json.loads(line)
            except ValueError as exc:
                return f"invalid JSON ({exc}): {line[:300]}"
            diff = json_diff(item[1], actual)
            return None if diff is None else f"{diff}\n            line: {line}"

        self.batch(corpus, "decode", cmd, items,
                   encode_in=lambda its: delimited([c.data for c, _ in its]),
                   split_out=split_lines, compare=compare,
                   describe=lambda it: (it[0].data.hex(), it[0].origin, json.dumps(it[1], ensure_ascii=False)))

    def encode(self, corpus: TypeCorpus) -> None:
        cmd = self.base_cmd("encode", corpus) + ["--delimited", "--deterministic"]
        self.batch(corpus, "encode", cmd, corpus.json_lines,
                   encode_in=lambda its: "".join(line + "\n" for line, _, _ in its).encode("utf-8"),
                   split_out=split_delimited,
                   compare=lambda it, actual: None if actual == it[1] else
                   f"{actual.hex()}\n  first difference: {wire_diff(it[1], actual, corpus.cls.DESCRIPTOR)}",
                   describe=lambda it: (it[0], "json of " + it[2], it[1].hex()))


def clip(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def write_corpus(out_dir: str, corpus: TypeCorpus) -> None:
    """<out>/<type>/{canonical,mutated,rejected}.delimited (varint-length-
    prefixed messages) and encode.jsonl (one JSON object per line)."""
    tdir = os.path.join(out_dir, corpus.type_name)
    os.makedirs(tdir, exist_ok=True)
    canonical = [c.data for c in corpus.accepted if c.origin == "canonical"]
    mutated = [c.data for c in corpus.accepted if c.origin != "canonical"]
    for name, msgs in (("canonical", canonical), ("mutated", mutated),
                       ("rejected", [c.data for c in corpus.rejected])):
        with open(os.path.join(tdir, f"{name}.delimited"), "wb") as fh:
            fh.write(delimited(msgs))
    with open(os.path.join(tdir, "encode.jsonl"), "w", encoding="utf-8") as fh:
        fh.writelines(line + "\n" for line, _, _ in corpus.json_lines)


def find_binary(path: Optional[str]) -> Optional[str]:
    if path:
        return path
    for cand in ("target/release/protoplane", "target/debug/protoplane"):
        full = os.path.join(REPO, cand)
        if os.access(full, os.X_OK):
            return full
    return None


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protoplane", help="path to the protoplane binary "
                    "(default: target/release/protoplane or target/debug/protoplane)")
    ap.add_argument("--count", type=int, default=500, help="random messages per type (default 500)")
    ap.add_argument("--seed", type=int, default=1, help="RNG seed (default 1)")
    ap.add_argument("--out-dir", help="write the generated corpus here (for fuzzers)")
    ap.add_argument("--types", help="comma-separated subset of message types")
    ap.add_argument("--max-rejects", type=int, default=40, help="malformed inputs kept per type (default 40)")
    ap.add_argument("--show", type=int, default=30, help="failures printed in full (default 30)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per protoplane process")
    ap.add_argument("--python-map-order", action="store_true",
                    help="expect upb's own deterministic map order instead of ascending keys")
    ap.add_argument("--gray-areas", action="store_true",
                    help="also expect upb's behaviour where the spec leaves it open "
                    "(unknown fields inside map entries)")
    ap.add_argument("--python-only", action="store_true",
                    help="only build the corpus and run the harness self-checks")
    args = ap.parse_args(argv)

    types = TYPES
    if args.types:
        wanted = set(args.types.split(","))
        types = [t for t in TYPES if t[1] in wanted]
        if not types:
            ap.error(f"no known type in {args.types}")

    binary = None
    if not args.python_only:
        binary = find_binary(args.protoplane)
        if binary is None or not os.access(binary, os.X_OK):
            print(f"crosscheck: protoplane binary not found ({binary or 'target/*/protoplane'});"
                  " build it or pass --protoplane", file=sys.stderr)
            return 2
        binary = os.path.abspath(binary)

    t0 = time.monotonic()
    selfcheck = SelfCheck()
    with tempfile.TemporaryDirectory(prefix="pp-crosscheck-") as tmp:
        schema = compile_schema(tmp)
    oracle = Oracle(python_map_order=args.python_map_order)
    corpora = [build_corpus(schema, proto, name, args.count, args.seed, selfcheck, args.max_rejects,
                            oracle, args.gray_areas)
               for proto, name in types]
    for c in corpora:
        print(f"crosscheck: {c.type_name}: {len(c.accepted)} accepted inputs, "
              f"{len(c.rejected)} rejected inputs, {len(c.json_lines)} JSON lines"
              + (f" ({c.json_skipped} skipped: Python cannot parse them)" if c.json_skipped else ""))
        if args.out_dir:
            write_corpus(args.out_dir, c)
    print(f"crosscheck: corpus built in {time.monotonic() - t0:.1f}s; "
          f"harness self-checks: {selfcheck.passed} ok, {len(selfcheck.errors)} failed")

    if args.python_only:
        print(f"crosscheck: {selfcheck.passed} passed, {len(selfcheck.errors)} failed")
        return 0 if not selfcheck.errors else 1

    runner = Runner(binary, args.timeout, args.show)
    for c in corpora:
        runner.roundtrip(c, view=False)
        runner.roundtrip(c, view=True)
        runner.rejects(c, view=False)
        runner.rejects(c, view=True)
        runner.decode(c)
        runner.encode(c)

    if args.out_dir:
        with open(os.path.join(args.out_dir, "failures.jsonl"), "w", encoding="utf-8") as fh:
            for f in runner.failures:
                fh.write(json.dumps(dataclasses.asdict(f), ensure_ascii=False) + "\n")
    by_mode: dict[tuple[str, str], int] = {}
    for f in runner.failures:
        by_mode[(f.type_name, f.mode)] = by_mode.get((f.type_name, f.mode), 0) + 1
    for (type_name, mode), n in sorted(by_mode.items()):
        print(f"crosscheck: {n} failures in {type_name} {mode}")
    if selfcheck.errors:
        print(f"crosscheck: {len(selfcheck.errors)} harness self-check failures (see stderr)")
    print(f"crosscheck: {runner.processes} protoplane processes, {time.monotonic() - t0:.1f}s")
    failed = len(runner.failures) + len(selfcheck.errors)
    print(f"crosscheck: {runner.passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
