"""Figures that name the results file they were drawn with.

A figure a README shows is written by the command that writes its results file:

    python tools/capture.py dqn_run \
        --figure runs/capture/dqn/latest/learning_curve.png=2_Cart_Pole_DQN/assets/learning_curve.png \
        -- python 2_Cart_Pole_DQN/cart_pole_dqn.py --out runs/capture/dqn

`tools/capture.py` runs the command, writes `benchmarks/results/dqn_run.txt`, then copies each figure the command
wrote to its place in a module's `assets/` and stamps it with `stamp`: the results file's name and the SHA-256 of
that file, inside the image (a PNG `tEXt` chunk, a GIF comment; the pixels are untouched). `tests/test_docs.py`
reads the stamp of every image a README shows: an image with no stamp, or whose results file has changed since,
fails like a stale number. `python tools/remeasure.py --figures` draws every figure again, each through the
capture that records it.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path

KEY = "jax-rl-course-source"  # the PNG tEXt keyword, and the prefix of the GIF comment
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class FigureError(Exception):
    """An image this module cannot stamp or read: one line."""


def digest(results_file: Path) -> str:
    """SHA-256 of a results file's bytes: what a stamp compares against."""
    return hashlib.sha256(Path(results_file).read_bytes()).hexdigest()


def source_text(results_name: str, sha256: str) -> str:
    return json.dumps({"results": results_name, "sha256": sha256}, sort_keys=True)


# ----------------------------------------------------------------------------- PNG: a tEXt chunk before IEND


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    if not data.startswith(PNG_SIGNATURE):
        raise FigureError("not a PNG file")
    chunks, pos = [], len(PNG_SIGNATURE)
    while pos < len(data):
        if pos + 8 > len(data):
            raise FigureError("a truncated PNG chunk")
        (length,), kind = struct.unpack(">I", data[pos : pos + 4]), data[pos + 4 : pos + 8]
        chunks.append((kind, data[pos + 8 : pos + 8 + length]))
        pos += 12 + length
    if not chunks or chunks[-1][0] != b"IEND":
        raise FigureError("a PNG without its IEND chunk")
    return chunks


def _png_bytes(chunks: list[tuple[bytes, bytes]]) -> bytes:
    out = [PNG_SIGNATURE]
    for kind, body in chunks:
        out.append(struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body)))
    return b"".join(out)


def _is_stamp(kind: bytes, body: bytes) -> bool:
    return kind == b"tEXt" and body.startswith(KEY.encode() + b"\0")


# ----------------------------------------------------------------------------- GIF: a comment before the trailer


def _gif_comment(text: str) -> bytes:
    raw, blocks = f"{KEY}={text}".encode(), []
    for i in range(0, len(raw), 255):
        part = raw[i : i + 255]
        blocks.append(bytes([len(part)]) + part)
    return b"\x21\xfe" + b"".join(blocks) + b"\x00"


def _gif_stamp(data: bytes) -> tuple[int, int, str] | None:
    """(start, end, text) of the comment extension that holds the stamp, or None."""
    start, prefix = data.find(b"\x21\xfe"), KEY.encode() + b"="
    while start != -1:
        pos, text = start + 2, b""
        while pos < len(data) and data[pos] != 0:
            text += data[pos + 1 : pos + 1 + data[pos]]
            pos += 1 + data[pos]
        if text.startswith(prefix):
            return start, pos + 1, text[len(prefix) :].decode()
        start = data.find(b"\x21\xfe", start + 2)
    return None


# ----------------------------------------------------------------------------- the two calls


def stamp(image: Path, results_name: str, sha256: str) -> bytes:
    """The bytes of `image` with its stamp (any earlier one replaced); the caller writes them."""
    data, text = Path(image).read_bytes(), source_text(results_name, sha256)
    if data.startswith(PNG_SIGNATURE):
        chunks = [c for c in _png_chunks(data) if not _is_stamp(*c)]
        return _png_bytes(chunks[:-1] + [(b"tEXt", KEY.encode() + b"\0" + text.encode("latin-1"))] + chunks[-1:])
    if data[:6] in (b"GIF87a", b"GIF89a"):
        found = _gif_stamp(data)
        if found:
            data = data[: found[0]] + data[found[1] :]
        if not data.endswith(b"\x3b"):
            raise FigureError(f"{image}: a GIF without its trailer")
        return b"GIF89a" + data[6:-1] + _gif_comment(text) + b"\x3b"
    raise FigureError(f"{image}: only PNG and GIF figures can be stamped")


def read_stamp(image: Path) -> dict | None:
    """{'results': NAME.txt, 'sha256': …} recorded in `image`, or None when it has no stamp."""
    data = Path(image).read_bytes()
    if data.startswith(PNG_SIGNATURE):
        for kind, body in _png_chunks(data):
            if _is_stamp(kind, body):
                return json.loads(body.split(b"\0", 1)[1].decode("latin-1"))
        return None
    if data[:6] in (b"GIF87a", b"GIF89a"):
        found = _gif_stamp(data)
        return json.loads(found[2]) if found else None
    raise FigureError(f"{image}: not a PNG or GIF file")


def check(image: Path, results_dir: Path) -> str | None:
    """Why `image` is not drawn from the current results file, or None when it is."""
    try:
        source = read_stamp(image)
    except (FigureError, ValueError) as e:
        return f"{image.name}: cannot read its source ({e})"
    if source is None:
        return f"{image.name} records no results file: draw it with `tools/capture.py NAME --figure …`"
    results_file = results_dir / source["results"]
    if not results_file.is_file():
        return f"{image.name} was drawn with {source['results']}, which is gone"
    if digest(results_file) != source["sha256"]:
        name = results_file.stem
        return f"{image.name} is stale: {source['results']} changed since; `python tools/remeasure.py {name}`"
    return None
