"""Problems with a diagram and a ground truth, and one loader for every source we read.

Sources `load_problems` accepts (the schema is detected from the keys, docs/notes.md §5):

- a folder in the `problems.jsonl` + `images/` layout (../shared/data/geo-real-sample and our synthetic data;
  with `split`, the folder `<source>/<split>/` is read when it exists);
- a local `.jsonl` / `.parquet` file in one of the schemas below;
- a hub dataset name (`hiyouga/geometry3k`, `leonardPKU/GEOQA_R1V_Train_8K`, `leonardPKU/GEOQA_8K_R1V`),
  read with `datasets.load_dataset` (imported only then; `split` defaults to "train") and `load_hf_dataset`,
  which also takes a `datasets.Dataset` already in memory.

Schemas (keys of one row):

- layout:     `id, question, answer, image` (+ `source, choices, answer_value, kind, level`); `image` is a path
              relative to the jsonl's folder.
- geometry3k: `images` (list of {bytes, path} / paths / PIL images), `problem` (with "<image>"), `answer` (the
              option *value*), optional `choices` and `id`. With `choices`, the answer letter is the value's
              position and the question gets the Geometry3K `Choices:` line, as in geo-real-sample. EasyR1's
              `leonardPKU/GEOQA_8K_R1V` (problem/answer/images, no choices) is read by the same path.
- r1v:        `image`, `problem`, `solution` (answer inside `<answer>…</answer>`), optional `id`.

Every image is read once at load, whatever its format (PNG, JPEG, GIF, WebP, TIFF, BMP...) and mode (RGB, CMYK,
palette, grey, 16-bit, with alpha): `_stored_image` owns that. It checks the size from the header (over
MAX_IMAGE_PIXELS is refused before a pixel is decoded, so a 12000x12000 PNG never takes gigabytes) and the aspect
ratio (over MAX_ASPECT_RATIO, which Qwen2-VL's image processor refuses), then decodes the image whole. A single-frame
RGB PNG is used as it is; any other image becomes an RGB PNG: its first frame, turned upright by its EXIF
orientation, transparency laid over white, 16-bit values scaled to 8. PNG is the store's image format (the `png`
column of its images table), so `Problem.image_path` is always an RGB PNG file on disk: what the model sees is what
the store keeps. Converted images and images given as bytes are written once to a content-addressed cache folder
(temp file then rename, so the cache never holds half a file; a converted image is named by its source's hash and
is not converted again).

Text is bounded too: a question, answer or answer value over `max_text_chars` characters is a bad row (training
derives the limit from the model's context: `run_config`; by default DEFAULT_MAX_TEXT_CHARS), and a line of a .jsonl
file over `max_line_bytes(max_text_chars)` is refused after reading no more than that, before it is parsed. A line
that is not UTF-8, not JSON or not an object, and an answer that is NaN, are bad rows like any other: refused in one
line naming the file, row and id, or skipped and counted with `skip_bad`.

A dataset reads only its own folder: an image path resolves inside the folder of its problems.jsonl (or of its
.jsonl / .parquet file); an absolute path, a `..` or a symlink that leads out of it is a bad row, decided before the
file is touched, so the message says nothing about what lies outside. A hub dataset has no folder: its images must
be embedded bytes. `allow_outside_paths=True` (`dataset_allow_outside_paths=true`, `fastrl eval
--allow-outside-paths`) lets paths point anywhere.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import re
import string
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
from PIL import Image, ImageOps

logger = logging.getLogger(__name__)

DEFAULT_IMAGE_CACHE = Path.home() / ".cache" / "fastrl" / "images"
HUB_KINDS = {
    "hiyouga/geometry3k": "Geometry3K",
    "leonardPKU/GEOQA_R1V_Train_8K": "GeoQA",
    "leonardPKU/GEOQA_8K_R1V": "GeoQA",
}
LETTERS = string.ascii_uppercase
# Larger images are refused (a bad row) from their header. 4096x4096: above Qwen2.5-VL's own default max_pixels
# (12,845,056), so no image the model would see whole is refused; PIL itself only warns up to 89 M pixels.
MAX_IMAGE_PIXELS = 4096 * 4096
# The longer side over the shorter: Qwen2-VL's image processor (transformers' `smart_resize`, also vLLM's) raises
# past 200, inside the first rollout; such an image is refused at load instead.
MAX_ASPECT_RATIO = 200
# Characters of a question, answer or answer value. Training derives the limit from the model's context
# (`text_limit`, through run_config); a caller that names no model gets the limit of a 32,768-token context.
CHARS_PER_TOKEN = 4  # about what a BPE tokenizer averages on English text: a longer text alone fills the context
DEFAULT_CONTEXT_TOKENS = 32_768
DEFAULT_MAX_TEXT_CHARS = CHARS_PER_TOKEN * DEFAULT_CONTEXT_TOKENS
ORIENTATION = 0x0112  # the EXIF tag of a photo's orientation: an image with one is turned upright at load
WHITE = (255, 255, 255)  # what a transparent pixel becomes (transformers' own RGB conversion does the same)
_CONVERTED = b"fastrl-rgb-png-1\0"  # salts a converted image's cache name: never the name of a file kept as it is
_ID_IN_LINE = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"')
OUTSIDE_HINT = "dataset_allow_outside_paths=true or fastrl eval --allow-outside-paths allows them"
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class Problem:
    """One question about one diagram."""

    id: str
    question: str  # text shown to the model, without the template; multiple choice includes the `Choices:` line
    answer: str  # ground truth as the source gives it (letter for multiple choice, value otherwise)
    answer_value: str  # the answer as a value (the option's text for multiple choice)
    choices: tuple[str, ...] | None  # option strings in display order, lettered A, B, ...; None = free-form
    image_path: Path | None  # absolute path of the diagram; from load_problems always a single-frame RGB PNG
    source: str = ""
    kind: str = ""  # synthetic task kind or dataset name
    level: int = 0  # synthetic difficulty level (0 for real data)

    def load_image(self) -> Image.Image:
        """The diagram as an RGB image."""
        if self.image_path is None:
            raise ValueError(f"problem {self.id!r} has no image")
        with Image.open(self.image_path) as image:
            return image.convert("RGB")


class LoadedProblems(list):
    """The list `load_problems` returns; `skipped` lists "row <i> (id <id>): <reason>" for each row skipped
    with `skip_bad=True` (empty otherwise), so `len(result.skipped)` is the count of bad rows."""

    def __init__(self, problems: Iterable[Problem] = (), skipped: Iterable[str] = ()) -> None:
        super().__init__(problems)
        self.skipped: list[str] = list(skipped)


class DataError(ValueError):
    """A dataset that cannot be read: no such file or folder, a bad row (the message names the file, row and id).
    The CLI prints it as one line (exit code 2)."""


class BadRow(ValueError):
    """A row that cannot become a Problem (the message says why)."""


class ImageTooLarge(BadRow):
    """A row whose image has more than MAX_IMAGE_PIXELS pixels."""


class BadLine(BadRow):
    """A line of a .jsonl file that is not a row (not UTF-8, not JSON, not an object, too long); `row_id`: the id
    read from its raw bytes when one is there (None otherwise), so the message names it."""

    def __init__(self, message: str, row_id: str | None = None) -> None:
        super().__init__(message)
        self.row_id = row_id


def text_limit(context_tokens: int | None) -> int:
    """The longest question or answer (characters) for a model whose context is `context_tokens` tokens:
    CHARS_PER_TOKEN characters a token (DEFAULT_MAX_TEXT_CHARS when the context is unknown)."""
    return CHARS_PER_TOKEN * (context_tokens or DEFAULT_CONTEXT_TOKENS)


def max_line_bytes(max_text_chars: int) -> int:
    """The longest .jsonl line read: a row holds at most four texts of `max_text_chars` characters (question,
    answer, answer value, choices), each character at most 6 bytes of JSON (\\uXXXX), plus 1 MiB for the rest."""
    return 24 * max_text_chars + (1 << 20)


@dataclass(frozen=True)
class ImageSource:
    """Where a dataset's images come from: `folder`, the folder its image paths resolve in (None for a hub
    dataset: images must be embedded bytes), `cache`, where embedded bytes are written, and whether paths may
    lead outside the folder."""

    folder: Path | None
    cache: Path
    allow_outside: bool = False

    def path(self, value: str) -> Path:
        """The image file `value` names: inside `folder` unless outside paths are allowed (BadRow otherwise). The
        decision reads no file outside the folder, so the message is the same whether one exists there or not."""
        path = Path(value)
        if self.allow_outside:
            return path if path.is_absolute() or self.folder is None else self.folder / path
        if self.folder is None:
            raise BadRow(f"image path {value!r}: a hub dataset has no folder for paths to stay in (embed the image "
                         f"bytes; {OUTSIDE_HINT})")
        if path.is_absolute():
            raise BadRow(f"image path {value!r} is absolute: image paths stay inside the dataset folder "
                         f"{str(self.folder)!r} ({OUTSIDE_HINT})")
        resolved = (self.folder / path).resolve()  # through '..' and symlinks, whether the file exists or not
        if not resolved.is_relative_to(self.folder.resolve()):
            raise BadRow(f"image path {value!r} leads outside the dataset folder {str(self.folder)!r} (through "
                         f"'..' or a symlink; {OUTSIDE_HINT})")
        return resolved


def choices_line(choices: tuple[str, ...]) -> str:
    """The Geometry3K options line used in geo-real-sample: `Choices: A. 50  B. 55  C. 60  D. 70`."""
    return "Choices: " + "  ".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))


def with_choices(question: str, choices: tuple[str, ...] | None) -> str:
    """`question` followed by its `Choices:` line (unchanged if it has one already or there are no choices)."""
    if not choices or "Choices:" in question:
        return question
    return f"{question}\n{choices_line(choices)}"


def load_problems(
    source: str | Path,
    *,
    split: str | None = None,
    skip_bad: bool = False,
    limit: int | None = None,
    image_cache: Path | None = None,
    allow_outside_paths: bool = False,
    max_text_chars: int | None = None,
) -> LoadedProblems:
    """Load problems from a folder, a local .jsonl/.parquet file or a hub dataset name (see the module docstring).

    `split` picks the `<folder>/<split>/` subfolder when there is one (else the folder itself is read) or the hub
    split; a local file is one split and ignores it.

    A bad row (missing key, missing or NaN answer, missing, unreadable, too large or too elongated image, an image
    path leading out of the dataset's folder, duplicate id, a question or answer over `max_text_chars` characters
    (None: DEFAULT_MAX_TEXT_CHARS), a .jsonl line that is not UTF-8, not a JSON object or over
    `max_line_bytes(max_text_chars)`) raises DataError (a ValueError) naming the file and the row (index and
    id); with `skip_bad=True` it is skipped instead, logged as a warning, and listed in the result's `skipped`
    (`dataset_skip_bad=true` in training, `--skip-bad` in eval). `limit` stops after that many good problems.
    Embedded image bytes and converted images go to `image_cache` (default ~/.cache/fastrl/images).
    `allow_outside_paths`: image paths may lead out of the dataset's folder (see the module docstring).
    """
    cache = Path(image_cache) if image_cache is not None else DEFAULT_IMAGE_CACHE
    max_text_chars = max_text_chars or DEFAULT_MAX_TEXT_CHARS
    checks = dict(skip_bad=skip_bad, limit=limit, max_text_chars=max_text_chars)
    path = Path(source)
    if path.is_dir():
        if split is not None and (path / split / "problems.jsonl").is_file():
            path = path / split
        jsonl = path / "problems.jsonl"
        if not jsonl.is_file():
            raise DataError(f"{path}: no problems.jsonl in this folder")
        return _load_rows(_jsonl_rows(jsonl, max_line_bytes(max_text_chars)), where=str(jsonl),
                          images=ImageSource(path, cache, allow_outside_paths), kind=None, **checks)
    if path.suffix in (".jsonl", ".parquet") or path.exists():
        if not path.is_file():
            raise DataError(f"{path}: no such file")
        if path.suffix == ".jsonl":
            rows = _jsonl_rows(path, max_line_bytes(max_text_chars))
        elif path.suffix == ".parquet":
            rows = _parquet_rows(path)
        else:
            raise DataError(f"{path}: expected a folder, a .jsonl or a .parquet file")
        return _load_rows(rows, where=str(path), images=ImageSource(path.parent, cache, allow_outside_paths),
                          kind=None, **checks)
    return _load_hub(str(source), split=split, images=ImageSource(None, cache, allow_outside_paths), **checks)


def _jsonl_rows(path: Path, max_bytes: int) -> Iterator[dict | BadLine]:
    """Each non-blank line of a .jsonl file as a dict, or as a BadLine saying why it is not one (its 1-based line
    number in the message). A line is read up to `max_bytes`: the rest of a longer one is skipped, never held."""
    with open(path, "rb") as f:
        number = 0
        while line := f.readline(max_bytes + 1):
            number += 1
            if len(line) > max_bytes and not line.endswith(b"\n"):
                size = len(line) + _skip_line(f)
                yield BadLine(f"line {number} is {size:,} bytes, over the limit of {max_bytes:,} for a row "
                              "(max_text_chars bounds it)", _id_in(line))
                continue
            if number == 1 and line.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark
                line = line[3:]
            if not line.strip():
                continue
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                yield BadLine(f"line {number} is not UTF-8 text (byte {line[e.start]:#04x} at column {e.start + 1})",
                              _id_in(line))
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                yield BadLine(f"line {number} is not valid JSON ({e})", _id_in(line))
                continue
            if not isinstance(row, dict):
                yield BadLine(f"line {number}: expected a JSON object, got {type(row).__name__}")
                continue
            yield row


def _skip_line(f) -> int:
    """Read past the rest of the current line (1 MiB at a time); returns the bytes skipped."""
    skipped = 0
    while chunk := f.readline(1 << 20):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


def _id_in(line: bytes) -> str | None:
    """The `"id": "..."` of a line that does not parse, read from its bytes (None when there is none)."""
    match = _ID_IN_LINE.search(line)
    return match[1].decode("utf-8", errors="replace") if match else None


def _parquet_rows(path: Path) -> Iterator[dict]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    for batch in table.to_batches(max_chunksize=256):
        yield from batch.to_pylist()


def _load_hub(name: str, *, split: str | None, images: ImageSource, skip_bad: bool, limit: int | None,
              max_text_chars: int) -> LoadedProblems:
    """A hub dataset through `datasets` (imported here only)."""
    try:
        import datasets
    except ImportError as e:
        raise ValueError(f"{name!r} is not a local folder or file, and reading it from the hub needs `datasets`") from e
    split = split or "train"
    dataset = datasets.load_dataset(name, split=split)
    return load_hf_dataset(dataset, where=f"{name}[{split}]", kind=HUB_KINDS.get(name), image_cache=images.cache,
                           skip_bad=skip_bad, limit=limit, allow_outside_paths=images.allow_outside,
                           max_text_chars=max_text_chars)


def load_hf_dataset(dataset, *, where: str, kind: str | None = None, image_cache: Path | None = None,
                    skip_bad: bool = False, limit: int | None = None, allow_outside_paths: bool = False,
                    max_text_chars: int | None = None) -> LoadedProblems:
    """Problems from a `datasets.Dataset` in one of the schemas above (what `load_problems` does for hub names).

    Image columns are read undecoded ({bytes, path}), so each image is checked and converted from its original
    bytes (`_stored_image`); an image given only as a path is refused unless `allow_outside_paths` (a dataset in
    memory has no folder). The other arguments are `load_problems`'s.
    """
    import datasets

    for column in ("image", "images"):
        if column not in dataset.features:
            continue
        feature = dataset.features[column]
        if isinstance(feature, datasets.Image):
            dataset = dataset.cast_column(column, datasets.Image(decode=False))
        elif isinstance(getattr(feature, "feature", None), datasets.Image):
            dataset = dataset.cast_column(column, datasets.List(datasets.Image(decode=False)))
    cache = Path(image_cache) if image_cache is not None else DEFAULT_IMAGE_CACHE
    return _load_rows(iter(dataset), where=where, images=ImageSource(None, cache, allow_outside_paths), kind=kind,
                      skip_bad=skip_bad, limit=limit, max_text_chars=max_text_chars or DEFAULT_MAX_TEXT_CHARS)


def _load_rows(rows: Iterator[dict | BadLine], *, where: str, images: ImageSource, kind: str | None,
               skip_bad: bool, limit: int | None, max_text_chars: int) -> LoadedProblems:
    problems = LoadedProblems()
    seen: set[str] = set()
    too_large = 0
    parse: Callable[..., Problem] | None = None
    for index, row in enumerate(rows):
        if limit is not None and len(problems) >= limit:
            break
        row_id = row.row_id if isinstance(row, BadLine) else row.get("id")
        try:
            if isinstance(row, BadLine):
                raise row
            if parse is None:
                parse = _schema_of(row)
            problem = parse(row, index=index, images=images, kind=kind)
            _check_text(problem, max_text_chars)
            if problem.id in seen:
                raise BadRow(f"duplicate id {problem.id!r}")
        except BadRow as e:
            message = f"row {index} (id {row_id!r}): {e}"
            if not skip_bad:
                raise DataError(f"{where}: {message}") from None
            problems.skipped.append(message)
            too_large += isinstance(e, ImageTooLarge)
            continue
        seen.add(problem.id)
        problems.append(problem)
    if too_large:
        logger.warning("%s: refused %d images over %s pixels (their rows are skipped)", where, too_large,
                       f"{MAX_IMAGE_PIXELS:,}")
    if problems.skipped:
        logger.warning("%s: skipped %d bad rows, first: %s", where, len(problems.skipped), problems.skipped[0])
    if not problems and limit != 0:
        if problems.skipped:
            raise DataError(f"{where}: no usable problems: all {len(problems.skipped)} rows are bad, first: "
                            f"{problems.skipped[0]}")
        raise DataError(f"{where}: no problems (the file has no rows)")
    return problems


def _schema_of(row: dict) -> Callable[..., Problem]:
    keys = set(row)
    if {"question", "answer", "image"} <= keys:
        return _from_layout
    if {"images", "problem"} <= keys:
        return _from_geometry3k
    if {"image", "problem"} <= keys:
        return _from_r1v
    raise BadRow(
        f"unknown schema, keys {sorted(keys)}; expected layout (id, question, answer, image), "
        "Geometry3K (images, problem, answer) or R1-V (image, problem, solution)"
    )


def _required(row: dict, key: str) -> Any:
    if key not in row:
        raise BadRow(f"missing key {key!r}")
    value = row[key]
    if value is None or (isinstance(value, str) and not value.strip()):
        raise BadRow(f"empty {key!r}")
    return value


def _text(row: dict, key: str, *, strip: bool = True) -> str:
    value = _required(row, key)
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise BadRow(f"{key!r} must be text, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise BadRow(f"{key!r} is {value} (a missing value?), not text or a number")
    return str(value).strip() if strip else str(value)


def _check_text(problem: Problem, max_text_chars: int) -> None:
    """BadRow when the question, answer or answer value is over `max_text_chars` characters, or the answer is the
    text "nan" (a missing value written out)."""
    for name, text in (("question", problem.question), ("answer", problem.answer),
                       ("answer value", problem.answer_value)):
        if len(text) > max_text_chars:
            raise BadRow(f"the {name} is {len(text):,} characters, over the limit of {max_text_chars:,} "
                         "(max_text_chars)")
    if problem.answer_value.strip().lower() == "nan":
        raise BadRow(f"the answer is {problem.answer_value!r} (a missing value written as text)")


def _choices(row: dict) -> tuple[str, ...] | None:
    choices = row.get("choices")
    if choices is None:
        return None
    if isinstance(choices, str) or not all(isinstance(c, (str, int, float)) for c in choices):
        raise BadRow(f"'choices' must be a list of strings, got {choices!r}")
    choices = tuple(str(c).strip() for c in choices)
    if not 2 <= len(choices) <= len(LETTERS):
        raise BadRow(f"'choices' must have 2 to {len(LETTERS)} options, got {len(choices)}")
    return choices


def _image(value: Any, images: ImageSource) -> Path:
    """An image given as a path, a {bytes, path} dict, bytes or a PIL image -> an RGB PNG file on disk
    (`_stored_image`)."""
    if isinstance(value, Image.Image):
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return _stored_image(buffer.getvalue(), "embedded image", images.cache)
    if isinstance(value, dict):
        if value.get("bytes"):
            return _stored_image(bytes(value["bytes"]), "embedded image", images.cache)
        value = value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return _stored_image(bytes(value), "embedded image", images.cache)
    if isinstance(value, str) and value.strip():
        path = images.path(value)
        if not path.is_file():
            raise BadRow(f"image {value!r} not found")
        return _stored_image(path, f"image {value!r}", images.cache)
    raise BadRow(f"no image (got {type(value).__name__})")


def _stored_image(source: Path | bytes, name: str, cache: Path) -> Path:
    """The image `source` (a file, or embedded bytes; `name` says which in messages) as the file training reads
    and the store keeps: an RGB PNG. Checked from its header first (ImageTooLarge over MAX_IMAGE_PIXELS; BadRow
    over MAX_ASPECT_RATIO), then decoded whole. A file that is a single-frame, upright RGB PNG already is returned
    as it is (bytes of one are written to `cache/<sha256>.png`); anything else is converted by `_rgb`, once: into
    `cache/<sha256 of the salted source>.png`, which later loads find there and do not encode again."""
    try:
        with _opened(source) as image:
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                raise ImageTooLarge(f"is {width}x{height} ({width * height:,} pixels), over the limit of "
                                    f"{MAX_IMAGE_PIXELS:,} pixels (4096x4096): downscale it")
            if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
                raise BadRow(f"is {width}x{height}: its longer side is over {MAX_ASPECT_RATIO} times its shorter, "
                             "which Qwen2-VL's image processor refuses: crop or pad it")
            rgb_png = image.format == "PNG" and image.mode == "RGB" and getattr(image, "n_frames", 1) == 1
            image.verify()  # PNG chunk checksums (the image is unusable after it)
        with _opened(source) as image:
            image.load()  # the pixels: verify() passes a PNG whose checksums hold but whose data does not inflate
            as_is = rgb_png and image.getexif().get(ORIENTATION, 1) == 1
            if as_is and isinstance(source, Path):
                return source.resolve()
            data = source if isinstance(source, bytes) else source.read_bytes()
            if as_is:
                target = cache / f"{hashlib.sha256(data).hexdigest()}.png"
            else:
                target = cache / f"{hashlib.sha256(_CONVERTED + data).hexdigest()}.png"
                if not target.is_file():
                    data = _png(_rgb(image))
    except BadRow as e:
        raise type(e)(f"{name} {e}") from None
    except Exception as e:  # PIL raises many types for a broken file
        raise BadRow(f"{name} unreadable ({type(e).__name__}: {e})") from None
    _write_once(data, target)
    return target.resolve()


def _opened(source: Path | bytes) -> Image.Image:
    """`Image.open` on a file or bytes, PIL's own pixel-count warning silenced (MAX_IMAGE_PIXELS says more); PIL's
    DecompressionBombError (over 2x its own limit) becomes ImageTooLarge."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            return Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
        except Image.DecompressionBombError as e:
            raise ImageTooLarge(f"is over the limit of {MAX_IMAGE_PIXELS:,} pixels ({e})") from None


def _rgb(image: Image.Image) -> Image.Image:
    """The first frame of a decoded image as RGB: upright by its EXIF orientation, transparent pixels laid over
    WHITE, 16-bit and float values scaled to 8 bits (PIL's own conversion would clip them)."""
    image.seek(0)
    image = ImageOps.exif_transpose(image)
    if image.mode in ("I", "F") or image.mode.startswith("I;16"):
        values = np.asarray(image, dtype=np.float64)
        top = 1.0 if image.mode == "F" and values.max(initial=0) <= 1 else (
            65535.0 if image.mode.startswith("I;16") or values.max(initial=0) > 255 else 255.0)
        image = Image.fromarray(np.clip(np.rint(values * (255.0 / top)), 0, 255).astype(np.uint8))
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        image = Image.new("RGB", rgba.size, WHITE)
        image.paste(rgba, mask=rgba.getchannel("A"))
    return image.convert("RGB")


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _write_once(data: bytes, target: Path) -> None:
    """Write `data` to `target` unless it is there (temp file + rename: never half a file)."""
    if target.is_file():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".png")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _from_layout(row: dict, *, index: int, images: ImageSource, kind: str | None) -> Problem:
    problem_id = _text(row, "id")
    source = str(row.get("source") or "")
    choices = _choices(row)
    answer = _text(row, "answer")
    if choices is not None:
        if answer not in LETTERS[: len(choices)]:
            raise BadRow(f"answer {answer!r} is not one of the letters for {len(choices)} choices")
        answer_value = choices[LETTERS.index(answer)]
    else:
        answer_value = answer
    if row.get("answer_value") is not None and str(row["answer_value"]).strip() != answer_value:
        raise BadRow(f"answer_value {row['answer_value']!r} disagrees with answer {answer!r}")
    return Problem(
        id=problem_id,
        question=_text(row, "question", strip=False),
        answer=answer,
        answer_value=answer_value,
        choices=choices,
        image_path=_image(_required(row, "image"), images),
        source=source,
        kind=str(row.get("kind") or kind or source.split("/")[0]),
        level=_level(row),
    )


def _level(row: dict) -> int:
    level = row.get("level") or 0
    if isinstance(level, bool) or not isinstance(level, int):
        raise BadRow(f"'level' must be an integer, got {level!r}")
    return level


def _strip_image_tag(problem: str) -> str:
    return problem.replace("<image>", "").strip()


def _from_geometry3k(row: dict, *, index: int, images: ImageSource, kind: str | None) -> Problem:
    image_list = _required(row, "images")
    if isinstance(image_list, (str, dict, bytes, Image.Image)):
        image_list = [image_list]
    if len(image_list) != 1:
        raise BadRow(f"expected one image, got {len(image_list)}")
    value = _text(row, "answer")
    choices = _choices(row)
    if choices is not None:
        if value not in choices:
            raise BadRow(f"answer {value!r} is not one of the choices {list(choices)}")
        answer = LETTERS[choices.index(value)]
    else:
        answer = value
    problem_id = str(row.get("id") or f"geometry3k_{index}")
    return Problem(
        id=problem_id,
        question=with_choices(_strip_image_tag(_text(row, "problem")), choices),
        answer=answer,
        answer_value=value,
        choices=choices,
        image_path=_image(image_list[0], images),
        source=str(row.get("source") or problem_id),
        kind=kind or "Geometry3K",
    )


def _from_r1v(row: dict, *, index: int, images: ImageSource, kind: str | None) -> Problem:
    solution = _text(row, "solution")
    tagged = _ANSWER_TAG.findall(solution)
    if not tagged or not tagged[-1].strip():
        raise BadRow(f"no answer in <answer>...</answer> in solution {solution[:80]!r}")
    answer = tagged[-1].strip()
    problem_id = str(row.get("id") or f"geoqa_r1v_{index}")
    return Problem(
        id=problem_id,
        question=_strip_image_tag(_text(row, "problem")),
        answer=answer,
        answer_value=answer,
        choices=None,
        image_path=_image(_required(row, "image"), images),
        source=str(row.get("source") or problem_id),
        kind=kind or "GeoQA",
    )
