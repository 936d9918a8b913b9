"""serving.wire: BYTES tensors in binary form both ways, and a request body's Content-Encoding."""

import gzip
import struct
import zlib

import pytest

from serving import protocol, wire


def test_the_protocol_module_still_names_the_wire_codecs():
    """Callers of 0.1 imported these from serving.protocol."""
    for name in ("ProtocolError", "decode_content", "deserialize_bytes_tensor", "MAX_GZIP_MEMBERS"):
        assert getattr(protocol, name) is getattr(wire, name)
    assert protocol.serialize_bytes_tensor is wire.serialize_bytes_tensor


@pytest.mark.parametrize("elements", [[], [b""], [b"a", b"", "日本".encode(), bytes(300)]])
def test_bytes_tensor_roundtrip(elements):
    raw = wire.serialize_bytes_tensor(elements)
    assert len(raw) == sum(4 + len(e) for e in elements)
    assert wire.deserialize_bytes_tensor(raw) == elements
    if elements:
        assert raw[:4] == struct.pack("<I", len(elements[0]))


def test_bytes_tensor_split_stops_past_the_declared_count():
    """The split read the whole body before the count was compared: a megabyte of empty
    elements (262,144) held the event loop for 0.4 s. It stops at one more than declared: a
    body that also breaks off inside an element reports the count, not the break."""
    raw = wire.serialize_bytes_tensor([b"a", b"", b"b"]) + b"\x05\x00"
    assert wire.deserialize_bytes_tensor(raw[:-2], 3) == [b"a", b"", b"b"]
    with pytest.raises(wire.ProtocolError, match="holds more than 2 elements"):
        wire.deserialize_bytes_tensor(raw, 2)
    with pytest.raises(wire.ProtocolError, match="holds more than 3 elements"):
        wire.deserialize_bytes_tensor(raw, 3)  # a fourth begins
    with pytest.raises(wire.ProtocolError, match="ends inside an element length"):
        wire.deserialize_bytes_tensor(raw)  # no count: read to the break


def test_decode_content():
    body = b'{"a": 1}' * 10
    assert wire.decode_content(gzip.compress(body), "gzip", 100) == body
    assert wire.decode_content(zlib.compress(body), "deflate", 100) == body
    with pytest.raises(wire.ProtocolError) as too_big:
        wire.decode_content(gzip.compress(body), "gzip", 50)
    assert too_big.value.status == 413
    with pytest.raises(wire.ProtocolError, match="not valid gzip"):
        wire.decode_content(b"junk", "gzip", 100)


def test_gzip_members_are_all_decoded_and_trailing_garbage_is_refused():
    body = b'{"a": 1}' * 10
    two = gzip.compress(body[:30]) + gzip.compress(body[30:])  # RFC 1952: valid
    assert wire.decode_content(two, "gzip", 100) == body
    with pytest.raises(wire.ProtocolError, match="7 bytes after its gzip data"):
        wire.decode_content(gzip.compress(body) + b"garbage", "gzip", 100)
    with pytest.raises(wire.ProtocolError, match="after its deflate data"):
        wire.decode_content(zlib.compress(body) + b"x", "deflate", 100)
    with pytest.raises(wire.ProtocolError) as too_big:  # the limit spans the members
        wire.decode_content(gzip.compress(body) * 2, "gzip", 100)
    assert too_big.value.status == 413
    limit = wire.MAX_GZIP_MEMBERS
    members = gzip.compress(body) + gzip.compress(b"", mtime=0) * (limit - 1)
    assert wire.decode_content(members, "gzip", 100) == body  # as many as allowed
    many = members + gzip.compress(b"", mtime=0)  # 50,000 of these held the loop for 0.7 s
    with pytest.raises(wire.ProtocolError, match=f"more than {limit} gzip members") as error:
        wire.decode_content(many, "gzip", 100)
    assert error.value.status == 400
