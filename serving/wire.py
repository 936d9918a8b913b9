"""The protocol's bytes below its JSON: BYTES tensors in binary form, and a request body's
``Content-Encoding``. Bytes in, bytes out; imports the standard library only.

A BYTES tensor in binary form (the binary tensor data extension, which ``tritonclient.http``
uses by default) is a run of elements, each a 4-byte little-endian length followed by that many
bytes: :func:`serialize_bytes_tensor` writes the server's ``prediction`` so, and
:func:`deserialize_bytes_tensor` reads a request's ``source``. :func:`decode_content` undoes a
request body's gzip or deflate coding within the server's size limit, with the work bounded
whatever the body holds.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

__all__ = [
    "MAX_GZIP_MEMBERS",
    "ProtocolError",
    "decode_content",
    "deserialize_bytes_tensor",
    "serialize_bytes_tensor",
]

_LENGTH = struct.Struct("<I")  # a binary BYTES element's length prefix


class ProtocolError(Exception):
    """A request that the server refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def serialize_bytes_tensor(elements: Sequence[bytes]) -> bytes:
    """Serialize BYTES elements as the binary extension does.

    Parameters
    ----------
    elements : sequence of bytes
        The elements in row-major order.

    Returns
    -------
    bytes
        Each element as a 4-byte little-endian length followed by its bytes.
    """
    parts = []
    for element in elements:
        parts.append(_LENGTH.pack(len(element)))
        parts.append(element)
    return b"".join(parts)


def deserialize_bytes_tensor(buffer: bytes, max_elements: int | None = None) -> list[bytes]:
    """Split a binary BYTES tensor into its elements.

    Parameters
    ----------
    buffer : bytes
        Elements, each a 4-byte little-endian length followed by that many bytes.
    max_elements : int, optional
        The elements the tensor's shape declares: the split stops at one more (a megabyte of
        empty elements is 262,144 of them, which held the event loop for 0.4 s before the
        count was compared).

    Returns
    -------
    list of bytes

    Raises
    ------
    ProtocolError
        If the buffer ends inside a length prefix or inside an element, or holds more than
        ``max_elements`` elements.
    """
    elements = []
    view = memoryview(buffer)
    offset = 0
    while offset < len(view):
        if max_elements is not None and len(elements) == max_elements:
            raise ProtocolError(
                f"shape mismatch: the binary BYTES tensor data holds more than {max_elements} "
                "elements"
            )
        if offset + _LENGTH.size > len(view):
            raise ProtocolError("binary BYTES tensor data ends inside an element length")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += _LENGTH.size
        if offset + length > len(view):
            raise ProtocolError("binary BYTES tensor data ends inside an element")
        elements.append(bytes(view[offset : offset + length]))
        offset += length
    return elements


#: Most gzip members a body may hold (tools write one; some concatenate a few). Each member
#: costs a pass over what follows it, so 50,000 empty members in 1 MB held the event loop for
#: 0.7 s before this bound.
MAX_GZIP_MEMBERS = 16


def decode_content(body: bytes, content_encoding: str | None, max_bytes: int) -> bytes:
    """Undo a request's ``Content-Encoding`` (identity, gzip or deflate), within a size limit.

    Parameters
    ----------
    body : bytes
        The body as received.
    content_encoding : str or None
        The ``Content-Encoding`` header.
    max_bytes : int
        The largest decoded body accepted.

    Returns
    -------
    bytes
        The decoded body.

    Raises
    ------
    ProtocolError
        415 for an unknown encoding, 400 for corrupt data, 413 if the decoded body is too large.
    """
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise ProtocolError(
            f"unsupported Content-Encoding {content_encoding!r}; use gzip, deflate or none", 415
        )
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    parts, size, rest = [], 0, body
    while True:  # gzip: one member after another (RFC 1952 allows several); deflate: one
        if len(parts) == MAX_GZIP_MEMBERS:  # each member copies the rest: bound the work
            raise ProtocolError(
                f"request body has more than {MAX_GZIP_MEMBERS} gzip members; send one"
            )
        decompressor = zlib.decompressobj(wbits)
        try:
            decoded = decompressor.decompress(rest, max_bytes - size + 1)
        except zlib.error as exc:
            raise ProtocolError(f"request body is not valid {encoding} data: {exc}") from exc
        size += len(decoded)
        parts.append(decoded)
        if size > max_bytes:
            raise ProtocolError(f"decoded request body exceeds {max_bytes} bytes", 413)
        if not decompressor.eof:
            raise ProtocolError(f"request body is truncated {encoding} data")
        rest = decompressor.unused_data
        if not rest:
            return b"".join(parts)
        if encoding != "gzip" or not rest.startswith(b"\x1f\x8b"):
            raise ProtocolError(f"request body has {len(rest)} bytes after its {encoding} data")
