"""A folder's manifest: every file's size and sha256, so a damaged copy is told from a whole one.

    <folder>/manifest.json   {"files": {"policy/model.safetensors": {"size": 1234, "sha256": "9f2c..."}, ...}}

`write_manifest` records the files a folder holds once they are written (a checkpoint's temp folder, before it is
renamed into place: `fastrl_core.checkpoints`); `manifest_problem` says how a folder differs from its manifest: a
file missing, a size or a checksum that differs (a truncated or bit-flipped file), a manifest that does not read.
Sizes are compared first, so a truncated file is found without reading anything; checksums read each file once
(sha256 through OpenSSL, about 1-2 GB/s: seconds for a 7B model's weights and optimiser state).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from fastrl_core.store.layout import write_json

MANIFEST = "manifest.json"
_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> list[str]:
    """Every file under `folder` but the manifest, as sorted '/'-separated relative paths."""
    found = []
    for directory, _, names in os.walk(folder):
        for name in names:
            relative = os.path.relpath(os.path.join(directory, name), folder).replace(os.sep, "/")
            if relative != MANIFEST:
                found.append(relative)
    return sorted(found)


def write_manifest(folder: Path) -> None:
    """Record every file under `folder` (size and sha256) in `folder/manifest.json`, written atomically."""
    folder = Path(folder)
    files = {name: {"size": (folder / name).stat().st_size, "sha256": file_sha256(folder / name)}
             for name in _files(folder)}
    write_json({"files": files}, folder / MANIFEST)


def has_manifest(folder: Path) -> bool:
    return (Path(folder) / MANIFEST).is_file()


def manifest_problem(folder: Path) -> str | None:
    """How `folder` differs from its manifest, naming the first file that does ("trainer.pt: 1,000 bytes, the
    manifest says 52,731"), or None when every listed file has its size and checksum."""
    folder = Path(folder)
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
        entries = [(name, int(entry["size"]), str(entry["sha256"])) for name, entry in files.items()]
    except FileNotFoundError:
        return f"no {MANIFEST}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"{MANIFEST} does not read ({type(error).__name__}: {' '.join(str(error).split())[:120]})"
    for name, size, _ in entries:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"{MANIFEST} lists {name!r}, a path outside its folder"
        try:
            actual = (folder / name).stat().st_size
        except FileNotFoundError:
            return f"{name}: missing"
        if actual != size:
            return f"{name}: {actual:,} bytes, the manifest says {size:,}"
    for name, _, sha256 in entries:
        if file_sha256(folder / name) != sha256:
            return f"{name}: checksum differs from the manifest's (the file is damaged)"
    return None
