"""Files of many types, written by code here (offline, the same bytes on every machine and every
run: archive dates are fixed), and the features Magika's file-type classifier reads of them.

Each kind below writes one file from a seed: source code in several languages, markup and
data formats, and binary containers the standard library and Pillow write (PNG, JPEG, GIF,
BMP, WAV, ZIP, gzip, tar, SQLite, PDF). Magika's features are the first 1024 bytes of the
file's first 4096 (leading whitespace stripped, padded with 256 at the end) and the last 1024
of its last 4096 (trailing whitespace stripped, padded with 256 at the start): 2048 int32s.
"""

from __future__ import annotations

import gzip
import io
import json
import sqlite3
import tarfile
import tempfile
import wave
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

BEG, END, BLOCK, PAD = 1024, 1024, 4096, 256
WORDS = ("alpha", "beta", "gamma", "delta", "model", "tensor", "scale", "offset", "layer",
         "array", "buffer", "vector", "queue", "table", "value", "index", "count", "total")


def _words(rng: np.random.Generator, n: int) -> list[str]:
    return [WORDS[i] for i in rng.integers(0, len(WORDS), n)]


def _python(rng):
    lines = ['"""A generated module."""', "", "import math", ""]
    for name in _words(rng, int(rng.integers(3, 7))):
        lines += [f"def {name}_{int(rng.integers(99))}(x, y={int(rng.integers(9))}):",
                  f"    \"\"\"Return the {name} of x.\"\"\"",
                  f"    total = math.sqrt(x * x + y) + {rng.uniform():.3f}",
                  "    for i in range(3):", "        total += i * x", "    return total", ""]
    return "\n".join(lines).encode()


def _c(rng):
    lines = ["#include <stdio.h>", "#include <stdlib.h>", ""]
    for name in _words(rng, int(rng.integers(3, 6))):
        lines += [f"static int {name}(int n) {{", "    int s = 0;",
                  f"    for (int i = 0; i < n; ++i) s += i * {int(rng.integers(9))};",
                  "    return s;", "}", ""]
    lines += ["int main(void) {", '    printf("%d\\n", alpha(10));', "    return 0;", "}"]
    return "\n".join(lines).encode()


def _javascript(rng):
    lines = ["'use strict';", ""]
    for name in _words(rng, int(rng.integers(3, 6))):
        lines += [f"function {name}(items) {{",
                  f"  return items.map((x) => x * {int(rng.integers(9))}).filter(Boolean);",
                  "}", "", f"const {name}Result = {name}([1, 2, 3]);",
                  f"console.log({name}Result);", ""]
    lines += ["module.exports = { alpha };"]
    return "\n".join(lines).encode()


def _html(rng):
    items = "".join(f"<li class=\"{w}\">{w} {int(rng.integers(99))}</li>\n"
                    for w in _words(rng, int(rng.integers(5, 15))))
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{' '.join(_words(rng, 3))}</title>\n</head>\n<body>\n<h1>Report</h1>\n"
            f"<ul>\n{items}</ul>\n<p>Generated page.</p>\n</body>\n</html>\n").encode()


def _css(rng):
    return "".join(f".{w} {{\n  color: #{int(rng.integers(0, 0xFFFFFF)):06x};\n"
                   f"  margin: {int(rng.integers(20))}px;\n  display: flex;\n}}\n\n"
                   for w in _words(rng, int(rng.integers(4, 10)))).encode()


def _json(rng):
    data = {w: {"id": int(rng.integers(1000)), "score": round(float(rng.uniform()), 4),
                "tags": _words(rng, 3)} for w in _words(rng, int(rng.integers(4, 12)))}
    return json.dumps(data, indent=2).encode()


def _csv(rng):
    rows = ["name,count,score,label"] + [f"{w},{int(rng.integers(100))},"
                                         f"{rng.uniform():.4f},{_words(rng, 1)[0]}"
                                         for w in _words(rng, int(rng.integers(20, 60)))]
    return "\n".join(rows).encode()


def _xml(rng):
    items = "".join(f"  <item id=\"{i}\" name=\"{w}\">{int(rng.integers(99))}</item>\n"
                    for i, w in enumerate(_words(rng, int(rng.integers(5, 20)))))
    return f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<items>\n{items}</items>\n".encode()


def _markdown(rng):
    parts = [f"# {' '.join(_words(rng, 3)).title()}", ""]
    for w in _words(rng, int(rng.integers(3, 6))):
        parts += [f"## {w.title()}", "", f"The {w} is described here, with *emphasis* and "
                  f"`code`.", "", f"- first {w}", f"- second {w}", ""]
    return "\n".join(parts).encode()


def _shell(rng):
    lines = ["#!/bin/sh", "set -eu", ""]
    for w in _words(rng, int(rng.integers(3, 8))):
        lines += [f"if [ -f \"{w}.txt\" ]; then", f"  echo \"found {w}\"",
                  f"  cp \"{w}.txt\" /tmp/{w}.bak", "fi"]
    return "\n".join(lines).encode()


def _yaml(rng):
    lines = ["version: 2", "services:"]
    for w in _words(rng, int(rng.integers(2, 6))):
        lines += [f"  {w}:", f"    image: {w}:latest", "    ports:",
                  f"      - \"{int(rng.integers(1000, 9000))}:80\""]
    return "\n".join(lines).encode()


def _sql(rng):
    lines = []
    for w in _words(rng, int(rng.integers(2, 5))):
        lines += [f"CREATE TABLE {w} (id INTEGER PRIMARY KEY, name TEXT, score REAL);",
                  f"INSERT INTO {w} (name, score) VALUES ('{w}', {rng.uniform():.3f});",
                  f"SELECT name, score FROM {w} WHERE score > 0.5 ORDER BY score;"]
    return "\n".join(lines).encode()


def _image(fmt: str):
    def write(rng):
        from PIL import Image
        size = (int(rng.integers(16, 64)), int(rng.integers(16, 64)))
        pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        pixels[:, : size[0] // 2] //= 4  # some structure for the encoders
        image = Image.fromarray(pixels)
        if fmt == "GIF":
            image = image.convert("P")
        out = io.BytesIO()
        image.save(out, fmt)
        return out.getvalue()
    return write


def _wav(rng):
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        t = np.arange(int(rng.integers(2000, 8000))) / 16000
        tone = 0.3 * np.sin(2 * np.pi * rng.uniform(200, 800) * t)
        w.writeframes((tone * 32767).astype("<i2").tobytes())
    return out.getvalue()


def _zip(rng):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for w in _words(rng, int(rng.integers(2, 5))):  # a fixed date: the same bytes each run
            info = zipfile.ZipInfo(f"{w}.txt", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, " ".join(_words(rng, 200)))
    return out.getvalue()


def _gzip(rng):
    return gzip.compress(" ".join(_words(rng, 400)).encode(), mtime=0)


def _tar(rng):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for w in _words(rng, int(rng.integers(2, 4))):
            data = " ".join(_words(rng, 100)).encode()
            info = tarfile.TarInfo(f"{w}.txt")
            info.size, info.mtime = len(data), 0
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _sqlite(rng):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "data.db"
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, score REAL)")
            db.executemany("INSERT INTO items (name, score) VALUES (?, ?)",
                           [(w, float(rng.uniform())) for w in _words(rng, 50)])
        db.close()
        return path.read_bytes()


def _pdf(rng):
    text = " ".join(_words(rng, 12))
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
               b"/Resources << /Font << /F1 5 0 R >> >> >>",
               b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out, offsets = io.BytesIO(), []
    out.write(b"%PDF-1.4\n")
    for i, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % i + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.writelines(b"%010d 00000 n \n" % o for o in offsets)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n"
              % (len(objects) + 1, xref))
    return out.getvalue()


KINDS: dict[str, Callable[[np.random.Generator], bytes]] = {
    "python": _python, "c": _c, "javascript": _javascript, "html": _html, "css": _css,
    "json": _json, "csv": _csv, "xml": _xml, "markdown": _markdown, "shell": _shell,
    "yaml": _yaml, "sql": _sql, "png": _image("PNG"), "jpeg": _image("JPEG"),
    "gif": _image("GIF"), "bmp": _image("BMP"), "wav": _wav, "zip": _zip, "gzip": _gzip,
    "tar": _tar, "sqlite": _sqlite, "pdf": _pdf,
}


def features(content: bytes) -> np.ndarray:
    """Magika's 2048 input ints of a file's bytes (its `_extract_features_from_bytes`)."""
    head = content[:BLOCK].lstrip()[:BEG]
    tail = content[-BLOCK:].rstrip()[-END:] if content else b""
    beg = list(head) + [PAD] * (BEG - len(head))
    end = [PAD] * (END - len(tail)) + list(tail)
    return np.asarray(beg + end, np.int32)


def file_features(n: int, seed: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """n files, one kind after another from a seed's own order: {"bytes": (n, 1, 2048)}, and
    each file's kind (Magika's name for it)."""
    rng = np.random.default_rng(seed)
    names = list(KINDS)
    order = rng.permutation(len(names))
    kinds = [names[order[i % len(names)]] for i in range(n)]
    rows = [features(KINDS[kind](rng)) for kind in kinds]
    return {"bytes": np.stack(rows)[:, None, :]}, kinds
