"""Problems with a diagram and a ground truth, and one loader for every source we read.

Sources `load_problems` accepts (the schema is detected from the keys, NOTES §5):

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
) -> LoadedProblems:
    """Load problems from a folder, a local .jsonl/.parquet file or a hub dataset name (see the module docstring).

    `split` picks the `<folder>/<split>/` subfolder when there is one (else the folder itself is read) or the hub
    split; a local file is one split and ignores it.

    A bad row (missing key, missing answer, missing or unreadable image, duplicate id) raises DataError (a
    ValueError) naming the file and the row (index and id); with `skip_bad=True` it is skipped instead, logged as a
    warning, and listed in the result's `skipped` (`dataset_skip_bad=true` in training, `--skip-bad` in eval).
    `limit` stops after that many good problems. Embedded image bytes go to `image_cache` (default
    ~/.cache/fastrl/images).
    """
    cache = Path(image_cache) if image_cache is not None else DEFAULT_IMAGE_CACHE
    path = Path(source)
    if path.is_dir():
        if split is not None and (path / split / "problems.jsonl").is_file():
            path = path / split
        jsonl = path / "problems.jsonl"
        if not jsonl.is_file():
            raise DataError(f"{path}: no problems.jsonl in this folder")
        return _load_rows(_jsonl_rows(jsonl), where=str(jsonl), base=path, cache=cache, kind=None,
                          skip_bad=skip_bad, limit=limit)
    if path.suffix in (".jsonl", ".parquet") or path.exists():
        if not path.is_file():
            raise DataError(f"{path}: no such file")
        if path.suffix == ".jsonl":
            rows = _jsonl_rows(path)
        elif path.suffix == ".parquet":
            rows = _parquet_rows(path)
        else:
            raise DataError(f"{path}: expected a folder, a .jsonl or a .parquet file")
        return _load_rows(rows, where=str(path), base=path.parent, cache=cache, kind=None,
                          skip_bad=skip_bad, limit=limit)
    return _load_hub(str(source), split=split, cache=cache, skip_bad=skip_bad, limit=limit)


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


def _load_hub(name: str, *, split: str | None, cache: Path, skip_bad: bool, limit: int | None) -> LoadedProblems:
    """A hub dataset through `datasets` (imported here only)."""
    try:
        import datasets
    except ImportError as e:
        raise ValueError(f"{name!r} is not a local folder or file, and reading it from the hub needs `datasets`") from e
    split = split or "train"
    dataset = datasets.load_dataset(name, split=split)
    return load_hf_dataset(dataset, where=f"{name}[{split}]", kind=HUB_KINDS.get(name), image_cache=cache,
                           skip_bad=skip_bad, limit=limit)


def load_hf_dataset(dataset, *, where: str, kind: str | None = None, image_cache: Path | None = None,
                    skip_bad: bool = False, limit: int | None = None) -> LoadedProblems:
    """Problems from a `datasets.Dataset` in one of the schemas above (what `load_problems` does for hub names).

    Image columns are read undecoded ({bytes, path}) so the original bytes go to the cache unchanged.
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
    return _load_rows(iter(dataset), where=where, base=None, cache=cache, kind=kind, skip_bad=skip_bad, limit=limit)


def _load_rows(rows: Iterator[dict], *, where: str, base: Path | None, cache: Path, kind: str | None,
               skip_bad: bool, limit: int | None) -> LoadedProblems:
    problems = LoadedProblems()
    seen: set[str] = set()
    parse: Callable[..., Problem] | None = None
    for index, row in enumerate(rows):
        if limit is not None and len(problems) >= limit:
            break
        row_id = row.get("id")
        try:
            if parse is None:
                parse = _schema_of(row)
            problem = parse(row, index=index, base=base, cache=cache, kind=kind)
            if problem.id in seen:
                raise BadRow(f"duplicate id {problem.id!r}")
        except BadRow as e:
            message = f"row {index} (id {row_id!r}): {e}"
            if not skip_bad:
                raise DataError(f"{where}: {message}") from None
            problems.skipped.append(message)
            continue
        seen.add(problem.id)
        problems.append(problem)
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


def _checked_image(path: Path) -> Path:
    if not path.is_file():
        raise BadRow(f"image {str(path)!r} not found")
    try:
        _decode(path)
    except Exception as e:  # PIL raises many types for a broken file
        raise BadRow(f"image {str(path)!r} unreadable ({type(e).__name__}: {e})") from None
    return path.resolve()


def _decode(source) -> str | None:
    """Check that an image file (a path or a binary file object) decodes whole; returns its format. `verify()`
    checks the chunks' checksums only: a PNG whose checksums are valid but whose pixel data does not inflate passes
    it, so the pixels are decoded too (`load()`, ~0.1 ms for a 112x112 image)."""
    with Image.open(source) as image:
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


def _image(value: Any, *, base: Path | None, cache: Path) -> Path:
    """An image given as a path, a {bytes, path} dict or a PIL image -> a file on disk."""
    if isinstance(value, Image.Image):
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return _cached_image(buffer.getvalue(), cache)
    if isinstance(value, dict):
        if value.get("bytes"):
            return _cached_image(bytes(value["bytes"]), cache)
        value = value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return _cached_image(bytes(value), cache)
    if isinstance(value, str) and value.strip():
        path = Path(value)
        if not path.is_absolute() and base is not None:
            path = base / path
        return _checked_image(path)
    raise BadRow(f"no image (got {type(value).__name__})")


def _from_layout(row: dict, *, index: int, base: Path | None, cache: Path, kind: str | None) -> Problem:
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
        image_path=_image(_required(row, "image"), base=base, cache=cache),
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


def _from_geometry3k(row: dict, *, index: int, base: Path | None, cache: Path, kind: str | None) -> Problem:
    images = _required(row, "images")
    if isinstance(images, (str, dict, bytes, Image.Image)):
        images = [images]
    if len(images) != 1:
        raise BadRow(f"expected one image, got {len(images)}")
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
        image_path=_image(images[0], base=base, cache=cache),
        source=str(row.get("source") or problem_id),
        kind=kind or "Geometry3K",
    )


def _from_r1v(row: dict, *, index: int, base: Path | None, cache: Path, kind: str | None) -> Problem:
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
        image_path=_image(_required(row, "image"), base=base, cache=cache),
        source=str(row.get("source") or problem_id),
        kind=kind or "GeoQA",
    )
