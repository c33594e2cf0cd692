"""Content-Encoding of an upstream answer: which codings the HTTP client reads, and their decoder.

Contract:
- `decoder_for(value, limit)` takes a Content-Encoding header value (None or "identity": no
  decoder) and returns a `Decoder` for "gzip"/"x-gzip" and "deflate"; any other coding (br, zstd,
  compress, a list of codings) raises `UnsupportedEncoding` naming it. The client asks for
  `Accept-Encoding: identity`, so only an upstream that ignores that compresses at all.
- `Decoder.feed(data)` returns the decoded bytes of `data`, in pieces of at most `STEP` bytes;
  `Decoder.end()` those left at the end of the body. Both raise `DecodeError` for a corrupt
  stream, a body that ends inside it, or output beyond `limit` bytes in all (a decompression
  bomb). Output is inflated a step at a time and counted as it comes, so a bomb stops within one
  step past `limit`, whatever the ratio: memory peaks near `limit`, never at a multiple of it
  (inflating a chunk whole would build its output once in pieces and once joined).
- gzip reads every member of a multi-member body (RFC 1952: the members' contents concatenated);
  deflate reads the zlib-wrapped stream RFC 9110 specifies and the raw one some servers send,
  told apart by the zlib header's check bits.
"""

from __future__ import annotations

import zlib


class DecodeError(Exception):
    """The body cannot be decoded, or decodes to more than the limit."""


class UnsupportedEncoding(DecodeError):
    """A Content-Encoding the client does not decode."""


STEP = 1 << 18  # bytes inflated at a time
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_RAW_WBITS = -zlib.MAX_WBITS


def decoder_for(value: str | None, limit: int) -> Decoder | None:
    """The decoder for a Content-Encoding header's value (None: the body is not encoded)."""
    if value is None:
        return None
    coding = value.strip().lower()
    if coding in ("", "identity"):
        return None
    if coding in ("gzip", "x-gzip"):
        return Decoder(_GZIP_WBITS, limit)
    if coding == "deflate":
        return Decoder(None, limit)
    raise UnsupportedEncoding(f"the answer is encoded as {value.strip()[:40]!r}, which is not read")


class Decoder:
    """One body's decoder. `wbits` None: deflate, zlib-wrapped or raw (decided by its first two
    bytes)."""

    def __init__(self, wbits: int | None, limit: int) -> None:
        self._wbits = wbits
        self._limit = limit
        self._left = limit  # output still allowed
        self._inflate: zlib._Decompress | None = (
            zlib.decompressobj(wbits) if wbits is not None else None
        )
        self._head = b""  # deflate's first byte while the second is awaited
        self._fed = False

    def feed(self, data: bytes) -> list[bytes]:
        inflate = self._inflate
        if inflate is None:  # deflate, kind not known yet
            data = self._head + data
            if len(data) < 2:
                self._head = data
                return []
            self._head = b""
            zlib_wrapped = data[0] & 0x0F == 8 and ((data[0] << 8) | data[1]) % 31 == 0
            wbits = zlib.MAX_WBITS if zlib_wrapped else _RAW_WBITS
            inflate = self._inflate = zlib.decompressobj(wbits)
        self._fed = True
        pieces: list[bytes] = []
        try:
            while True:
                out = inflate.decompress(data, STEP)
                if out:
                    self._left -= len(out)
                    if self._left < 0:
                        raise DecodeError(
                            f"the answer's body decompresses to more than {self._limit} bytes"
                        )
                    pieces.append(out)
                data = inflate.unconsumed_tail
                if inflate.eof:
                    rest = inflate.unused_data  # the next gzip member, or padding
                    if self._wbits != _GZIP_WBITS or not rest.strip(b"\0"):
                        break
                    inflate = self._inflate = zlib.decompressobj(_GZIP_WBITS)
                    data = rest
                elif not data and len(out) < STEP:
                    break  # everything fed is inflated (a full step may have more to give)
        except zlib.error as exc:
            raise DecodeError(f"the answer's compressed body is corrupt ({exc})") from None
        return pieces

    def end(self) -> bytes:
        """What is left at the end of the body; an error if it ended inside the stream."""
        if not self._fed and not self._head:
            return b""  # no body at all (a HEAD answer, a 204)
        if self._head:
            raise DecodeError("the answer's compressed body ended after one byte")
        inflate = self._inflate
        assert inflate is not None
        if not inflate.eof:
            raise DecodeError("the answer's compressed body ended before its end")
        return b""
