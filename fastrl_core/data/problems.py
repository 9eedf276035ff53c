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

Images given as bytes are written once to a content-addressed cache folder (temp file then rename, so the cache
never holds half a file), so `Problem.image_path` is always a file on disk.

A dataset reads only its own folder: an image path resolves inside the folder of its problems.jsonl (or of its
.jsonl / .parquet file); an absolute path, a `..` or a symlink that leads out of it is a bad row, decided before the
file is touched, so the message says nothing about what lies outside. A hub dataset has no folder: its images must
be embedded bytes. `allow_outside_paths=True` (`dataset_allow_outside_paths=true`, `fastrl eval
--allow-outside-paths`) lets paths point anywhere. An image over MAX_IMAGE_PIXELS is refused from its header,
before its pixels are decoded (a 12000x12000 PNG would take gigabytes), so it is never trained on nor stored.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import string
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from PIL import Image

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
    image_path: Path | None  # absolute path of the diagram
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
) -> LoadedProblems:
    """Load problems from a folder, a local .jsonl/.parquet file or a hub dataset name (see the module docstring).

    `split` picks the `<folder>/<split>/` subfolder when there is one (else the folder itself is read) or the hub
    split; a local file is one split and ignores it.

    A bad row (missing key, missing answer, missing, unreadable or too large image, an image path leading out of
    the dataset's folder, duplicate id) raises DataError (a ValueError) naming the file and the row (index and
    id); with `skip_bad=True` it is skipped instead, logged as a warning, and listed in the result's `skipped`
    (`dataset_skip_bad=true` in training, `--skip-bad` in eval). `limit` stops after that many good problems.
    Embedded image bytes go to `image_cache` (default ~/.cache/fastrl/images). `allow_outside_paths`: image paths
    may lead out of the dataset's folder (see the module docstring).
    """
    cache = Path(image_cache) if image_cache is not None else DEFAULT_IMAGE_CACHE
    path = Path(source)
    if path.is_dir():
        if split is not None and (path / split / "problems.jsonl").is_file():
            path = path / split
        jsonl = path / "problems.jsonl"
        if not jsonl.is_file():
            raise DataError(f"{path}: no problems.jsonl in this folder")
        return _load_rows(_jsonl_rows(jsonl), where=str(jsonl), images=ImageSource(path, cache, allow_outside_paths),
                          kind=None, skip_bad=skip_bad, limit=limit)
    if path.suffix in (".jsonl", ".parquet") or path.exists():
        if not path.is_file():
            raise DataError(f"{path}: no such file")
        if path.suffix == ".jsonl":
            rows = _jsonl_rows(path)
        elif path.suffix == ".parquet":
            rows = _parquet_rows(path)
        else:
            raise DataError(f"{path}: expected a folder, a .jsonl or a .parquet file")
        return _load_rows(rows, where=str(path), images=ImageSource(path.parent, cache, allow_outside_paths),
                          kind=None, skip_bad=skip_bad, limit=limit)
    return _load_hub(str(source), split=split, images=ImageSource(None, cache, allow_outside_paths),
                     skip_bad=skip_bad, limit=limit)


def _jsonl_rows(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for index, line in enumerate(f):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: row {index}: not valid JSON ({e})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}: row {index}: expected a JSON object, got {type(row).__name__}")
            yield row


def _parquet_rows(path: Path) -> Iterator[dict]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    for batch in table.to_batches(max_chunksize=256):
        yield from batch.to_pylist()


def _load_hub(name: str, *, split: str | None, images: ImageSource, skip_bad: bool,
              limit: int | None) -> LoadedProblems:
    """A hub dataset through `datasets` (imported here only)."""
    try:
        import datasets
    except ImportError as e:
        raise ValueError(f"{name!r} is not a local folder or file, and reading it from the hub needs `datasets`") from e
    split = split or "train"
    dataset = datasets.load_dataset(name, split=split)
    return load_hf_dataset(dataset, where=f"{name}[{split}]", kind=HUB_KINDS.get(name), image_cache=images.cache,
                           skip_bad=skip_bad, limit=limit, allow_outside_paths=images.allow_outside)


def load_hf_dataset(dataset, *, where: str, kind: str | None = None, image_cache: Path | None = None,
                    skip_bad: bool = False, limit: int | None = None,
                    allow_outside_paths: bool = False) -> LoadedProblems:
    """Problems from a `datasets.Dataset` in one of the schemas above (what `load_problems` does for hub names).

    Image columns are read undecoded ({bytes, path}) so the original bytes go to the cache unchanged; an image
    given only as a path is refused unless `allow_outside_paths` (a dataset in memory has no folder).
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
                      skip_bad=skip_bad, limit=limit)


def _load_rows(rows: Iterator[dict], *, where: str, images: ImageSource, kind: str | None,
               skip_bad: bool, limit: int | None) -> LoadedProblems:
    problems = LoadedProblems()
    seen: set[str] = set()
    too_large = 0
    parse: Callable[..., Problem] | None = None
    for index, row in enumerate(rows):
        if limit is not None and len(problems) >= limit:
            break
        row_id = row.get("id")
        try:
            if parse is None:
                parse = _schema_of(row)
            problem = parse(row, index=index, images=images, kind=kind)
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
    return str(value).strip() if strip else str(value)


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


def _checked_image(path: Path, name: str) -> Path:
    """`path` (given as `name` in the row) when it is a whole image within the pixel limit."""
    if not path.is_file():
        raise BadRow(f"image {name!r} not found")
    try:
        _decode(path)
    except BadRow as e:
        raise type(e)(f"image {name!r} {e}") from None
    except Exception as e:  # PIL raises many types for a broken file
        raise BadRow(f"image {name!r} unreadable ({type(e).__name__}: {e})") from None
    return path.resolve()


def _decode(source) -> str | None:
    """Check that an image file (a path or a binary file object) decodes whole; returns its format. Its size is
    read from the header first: over MAX_IMAGE_PIXELS it is refused (ImageTooLarge) before any pixel is decoded.
    `verify()` checks the chunks' checksums only: a PNG whose checksums are valid but whose pixel data does not
    inflate passes it, so the pixels are decoded too (`load()`, ~0.1 ms for a 112x112 image)."""
    with warnings.catch_warnings():  # PIL warns from 89 M pixels at open: the size check below says more
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(source)
        except Image.DecompressionBombError as e:
            raise ImageTooLarge(f"is over the limit of {MAX_IMAGE_PIXELS:,} pixels ({e})") from None
    with image:
        width, height = image.size
        if width * height > MAX_IMAGE_PIXELS:
            raise ImageTooLarge(f"is {width}x{height} ({width * height:,} pixels), over the limit of "
                                f"{MAX_IMAGE_PIXELS:,} pixels (4096x4096): downscale it")
        image_format = image.format
        image.verify()
    if hasattr(source, "seek"):
        source.seek(0)
    with Image.open(source) as image:
        image.load()
    return image_format


def _cached_image(data: bytes, cache: Path) -> Path:
    """Write image bytes to `cache/<sha256>.<format>` once (temp file + rename: never half a file)."""
    try:
        suffix = (_decode(io.BytesIO(data)) or "png").lower()
    except BadRow as e:
        raise type(e)(f"embedded image {e}") from None
    except Exception as e:
        raise BadRow(f"embedded image unreadable ({type(e).__name__}: {e})") from None
    target = cache / f"{hashlib.sha256(data).hexdigest()}.{suffix}"
    if not target.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache, prefix=".tmp-", suffix=f".{suffix}")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return target.resolve()


def _image(value: Any, images: ImageSource) -> Path:
    """An image given as a path, a {bytes, path} dict or a PIL image -> a file on disk."""
    if isinstance(value, Image.Image):
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return _cached_image(buffer.getvalue(), images.cache)
    if isinstance(value, dict):
        if value.get("bytes"):
            return _cached_image(bytes(value["bytes"]), images.cache)
        value = value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return _cached_image(bytes(value), images.cache)
    if isinstance(value, str) and value.strip():
        return _checked_image(images.path(value), value)
    raise BadRow(f"no image (got {type(value).__name__})")


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
