"""Loading problems: real samples, the HF Geometry3K / R1-V schemas as local files, bad rows, the image cache.

Every test runs on the Geometry3K sample shipped in tests/data (40 problems, MIT), and again on the 277 problems of
../shared/data/geo-real-sample (Geometry3K + GeoQA) when that folder is present."""

import json
import logging
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastrl_core.data.problems import DataError, Problem, load_hf_dataset, load_problems

SHIPPED = Path(__file__).resolve().parent / "data" / "geometry3k-sample"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "geo-real-sample"
if not SHARED.is_dir():
    SHARED = Path("/work/shared/data/geo-real-sample")
# (problems, Geometry3K, GeoQA) in each sample
COUNTS = {SHIPPED: (40, 40, 0), SHARED: (277, 150, 127)}
SAMPLES = [SHIPPED] + [SHARED] * SHARED.is_dir()


@pytest.fixture(scope="module", params=SAMPLES, ids=[path.name for path in SAMPLES])
def sample_dir(request) -> Path:
    return request.param


@pytest.fixture(scope="module")
def sample(sample_dir) -> list[Problem]:
    return load_problems(sample_dir)


@pytest.fixture(scope="module")
def rows(sample_dir) -> list[dict]:
    return [json.loads(line) for line in (sample_dir / "problems.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def provenance(sample_dir) -> dict[str, dict]:
    lines = (sample_dir / "provenance.jsonl").read_text(encoding="utf-8").splitlines()
    return {row["id"]: row for row in map(json.loads, lines)}


def test_the_shipped_sample_is_small_licensed_and_a_copy_of_geo_real_sample():
    files = [path for path in SHIPPED.rglob("*") if path.is_file()]
    assert sum(path.stat().st_size for path in files) < 1_000_000
    assert "MIT License" in (SHIPPED / "LICENSE").read_text() and "Pan Lu" in (SHIPPED / "LICENSE").read_text()
    if not SHARED.is_dir():
        pytest.skip("../shared/data/geo-real-sample is absent")
    shared = {row["id"]: row for row in map(json.loads, (SHARED / "problems.jsonl").read_text().splitlines())}
    for row in map(json.loads, (SHIPPED / "problems.jsonl").read_text().splitlines()):
        assert row == shared[row["id"]] and row["source"].startswith("Geometry3K/")
        assert (SHIPPED / row["image"]).read_bytes() == (SHARED / row["image"]).read_bytes()


def test_all_sample_problems_load(sample, sample_dir):
    total, geometry3k, geoqa = COUNTS[sample_dir]
    assert len(sample) == total and not sample.skipped
    assert sum(p.kind == "Geometry3K" for p in sample) == geometry3k
    assert sum(p.kind == "GeoQA" for p in sample) == geoqa
    assert len({p.id for p in sample}) == total
    for p in sample:
        assert p.image_path.is_absolute() and p.image_path.is_file()
        if p.kind == "Geometry3K":
            assert len(p.choices) == 4 and p.answer in "ABCD" and p.answer_value == p.choices["ABCD".index(p.answer)]
            assert "\nChoices: A. " in p.question
        else:
            assert p.choices is None and p.answer == p.answer_value
    image = sample[0].load_image()
    assert image.mode == "RGB" and min(image.size) > 50


def test_limit_and_split_folder(sample, sample_dir):
    assert [p.id for p in load_problems(sample_dir, limit=5)] == [p.id for p in sample[:5]]
    # a split name with no such subfolder reads the folder itself (the samples have no splits)
    assert len(load_problems(sample_dir, split="train", limit=3)) == 3


def _geometry3k_rows(sample_dir, rows, provenance, *, as_bytes: bool) -> list[dict]:
    """The sample's Geometry3K rows in the HF schema: images as bytes, or as paths relative to the sample (a file
    of them reads them from its own folder: `_with_images` copies them there)."""
    out = []
    for row in rows:
        if row["choices"] is None:
            continue
        image = sample_dir / row["image"]
        hf = provenance[row["id"]]["hf_geometry3k_style"]
        images = [{"bytes": image.read_bytes(), "path": image.name}] if as_bytes else [row["image"]]
        out.append({"id": row["id"], "images": images, "problem": hf["problem"], "answer": hf["answer"],
                    "choices": row["choices"]})
    return out


def _r1v_rows(sample_dir, rows) -> list[dict]:
    """Every row in the R1-V schema: free-form, the answer's value in <answer> tags (a Geometry3K row's question
    keeps its Choices line, as text)."""
    return [
        {"image": {"bytes": (sample_dir / row["image"]).read_bytes(), "path": None}, "problem": row["question"],
         "solution": f"<think> ... </think> <answer>{row['answer_value']}</answer>"}
        for row in rows
    ]


def _assert_free_form(loaded: list[Problem], expected: list[Problem]):
    """`loaded` read through the R1-V schema from `expected`: same question, the value as the answer, no choices."""
    assert len(loaded) == len(expected)
    for got, want in zip(loaded, expected):
        assert (got.question, got.answer, got.answer_value, got.choices) == (
            want.question.strip(), want.answer_value, want.answer_value, None)
        assert got.image_path.read_bytes() == want.image_path.read_bytes()


def _with_images(folder: Path, sample_dir: Path) -> Path:
    """`folder` with a copy of the sample's images/ (a dataset reads images inside its own folder only)."""
    shutil.copytree(sample_dir / "images", folder / "images", dirs_exist_ok=True)
    return folder


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def _assert_same(loaded: list[Problem], expected: list[Problem], *, same_ids: bool = True):
    assert len(loaded) == len(expected)
    for got, want in zip(loaded, expected):
        if same_ids:
            assert got.id == want.id
        assert (got.question, got.answer, got.answer_value, got.choices) == (
            want.question, want.answer, want.answer_value, want.choices)
        assert got.image_path.read_bytes() == want.image_path.read_bytes()


def test_geometry3k_schema_parquet_and_jsonl_load_identically(sample, sample_dir, rows, provenance, tmp_path):
    expected = [p for p in sample if p.kind == "Geometry3K"]
    parquet = tmp_path / "geometry3k.parquet"
    pq.write_table(pa.Table.from_pylist(_geometry3k_rows(sample_dir, rows, provenance, as_bytes=True)), parquet)
    from_parquet = load_problems(parquet, image_cache=tmp_path / "cache")
    _assert_same(from_parquet, expected)
    assert all(p.kind == "Geometry3K" and p.image_path.parent == tmp_path / "cache" for p in from_parquet)
    jsonl = _write_jsonl(_with_images(tmp_path, sample_dir) / "geometry3k.jsonl",
                         _geometry3k_rows(sample_dir, rows, provenance, as_bytes=False))
    _assert_same(load_problems(jsonl, image_cache=tmp_path / "cache"), expected)


def test_r1v_schema_loads_identically(sample, sample_dir, rows, tmp_path):
    parquet = tmp_path / "geoqa.parquet"
    pq.write_table(pa.Table.from_pylist(_r1v_rows(sample_dir, rows)), parquet)
    loaded = load_problems(parquet, image_cache=tmp_path / "cache")
    _assert_free_form(loaded, sample)
    assert [p.id for p in loaded[:2]] == ["geoqa_r1v_0", "geoqa_r1v_1"] and loaded[0].kind == "GeoQA"


def test_easyr1_geoqa_schema_without_choices_is_free_form(sample_dir, rows, tmp_path):
    easy = [{"images": [r["image"]], "problem": "<image>" + r["question"],
             "answer": r["answer_value"]} for r in rows][:5]
    loaded = load_problems(_write_jsonl(_with_images(tmp_path, sample_dir) / "easy.jsonl", easy))
    assert [p.answer for p in loaded] == [r["answer"] for r in easy] and len(loaded) == 5
    assert all(p.choices is None and not p.question.startswith("<image>") for p in loaded)


def test_image_cache_is_content_addressed_and_never_half_written(sample_dir, rows, tmp_path):
    row = _r1v_rows(sample_dir, rows)[0]
    parquet = tmp_path / "twice.parquet"
    pq.write_table(pa.Table.from_pylist([row, dict(row, problem="another question")]), parquet)
    cache = tmp_path / "cache"
    first, second = load_problems(parquet, image_cache=cache)
    assert first.image_path == second.image_path
    assert [p.name for p in cache.iterdir()] == [first.image_path.name]  # one file, no temp files
    assert load_problems(parquet, image_cache=cache)[0].image_path == first.image_path


def _bad_folder(tmp_path: Path, sample_dir: Path, rows: list[dict]) -> Path:
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "broken.png").write_bytes(b"not a png")
    _with_images(folder, sample_dir)
    good = rows[:3]
    bad = [
        dict(good[0], id="no_image_file", image="images/missing.png"),
        dict(good[1], id="unreadable", image="broken.png"),
        {k: v for k, v in good[2].items() if k != "answer"} | {"id": "no_answer"},
        dict(good[0], id="letter_out_of_range", answer="E"),
    ]
    _write_jsonl(folder / "problems.jsonl", [good[0], bad[0], good[1], bad[1], bad[2], good[2], bad[3]])
    return folder


@pytest.mark.parametrize("row_index, row_id, reason", [
    (1, "no_image_file", "not found"),
    (3, "unreadable", "unreadable"),
    (4, "no_answer", "missing key 'answer'"),
    (6, "letter_out_of_range", "not one of the letters"),
])
def test_a_bad_row_names_the_file_row_and_id(sample_dir, rows, tmp_path, row_index, row_id, reason):
    folder = _bad_folder(tmp_path, sample_dir, rows)
    lines = (folder / "problems.jsonl").read_text().splitlines()
    only_bad = [lines[0], lines[row_index]]  # the error is raised at the first bad row, so isolate each one
    (folder / "problems.jsonl").write_text("\n".join(only_bad) + "\n")
    with pytest.raises(ValueError) as error:
        load_problems(folder)
    message = str(error.value)
    assert str(folder / "problems.jsonl") in message and f"row 1 (id '{row_id}')" in message and reason in message


def test_skip_bad_skips_and_counts(sample_dir, rows, tmp_path, caplog):
    folder = _bad_folder(tmp_path, sample_dir, rows)
    with caplog.at_level(logging.WARNING):
        loaded = load_problems(folder, skip_bad=True)
    assert [p.id for p in loaded] == [r["id"] for r in rows[:3]]
    assert len(loaded.skipped) == 4
    assert loaded.skipped[0].startswith("row 1 (id 'no_image_file')")
    assert "skipped 4 bad rows" in caplog.text


def test_bad_rows_in_hf_schemas(sample_dir, rows, tmp_path):
    r1v = _r1v_rows(sample_dir, rows)[:2]
    no_answer = _write_jsonl(tmp_path / "a.jsonl", [dict(r1v[0], image=str(sample_dir / rows[-1]["image"]),
                                                          solution="the answer is 3")])
    with pytest.raises(ValueError, match=r"a\.jsonl: row 0 \(id None\): no answer in <answer>"):
        load_problems(no_answer)
    broken = tmp_path / "b.parquet"
    pq.write_table(pa.Table.from_pylist([r1v[0], dict(r1v[1], image={"bytes": b"\x89PNG garbage", "path": None})]),
                   broken)
    with pytest.raises(ValueError, match=r"b\.parquet: row 1 .*embedded image unreadable"):
        load_problems(broken, image_cache=tmp_path / "cache")
    assert len(load_problems(broken, image_cache=tmp_path / "cache", skip_bad=True).skipped) == 1
    wrong_value = _write_jsonl(tmp_path / "c.jsonl", [{"images": [str(sample_dir / rows[0]["image"])], "problem": "x",
                                                        "answer": "99", "choices": ["1", "2"]}])
    with pytest.raises(ValueError, match="answer '99' is not one of the choices"):
        load_problems(wrong_value)


def test_unknown_schema_duplicate_ids_and_missing_sources(sample_dir, rows, tmp_path):
    with pytest.raises(DataError, match=r"row 0 .*unknown schema, keys \['foo'\]"):
        load_problems(_write_jsonl(tmp_path / "u.jsonl", [{"foo": 1}]))
    row = rows[0]
    _with_images(tmp_path, sample_dir)
    with pytest.raises(DataError, match=r"row 1 .*duplicate id"):
        load_problems(_write_jsonl(tmp_path / "d.jsonl", [row, row]))
    with pytest.raises(DataError, match=rf"row 0 \(id '{rows[0]['id']}'\): 'level' must be an integer"):
        load_problems(_write_jsonl(tmp_path / "l.jsonl", [dict(row, level="hard")]))
    with pytest.raises(DataError, match="no such file"):
        load_problems(tmp_path / "nothing.jsonl")
    with pytest.raises(DataError, match="no problems.jsonl"):
        load_problems(tmp_path)


def test_hf_datasets_objects_with_image_features_load_identically(sample, sample_dir, rows, provenance, tmp_path):
    # the hub path minus the download: a datasets.Dataset whose image columns are decoded Image features
    datasets = pytest.importorskip("datasets")
    geometry3k = datasets.Dataset.from_list(_geometry3k_rows(sample_dir, rows, provenance, as_bytes=True))
    geometry3k = geometry3k.cast_column("images", datasets.List(datasets.Image()))
    loaded = load_hf_dataset(geometry3k, where="hiyouga/geometry3k[train]", kind="Geometry3K",
                             image_cache=tmp_path / "cache")
    _assert_same(loaded, [p for p in sample if p.kind == "Geometry3K"])
    r1v = datasets.Dataset.from_list(_r1v_rows(sample_dir, rows)).cast_column("image", datasets.Image())
    _assert_free_form(load_hf_dataset(r1v, where="r1v", image_cache=tmp_path / "cache"), sample)


# ------------------------------------------------------------------------ a dataset reads only its own folder

def _outside_case(tmp_path: Path, sample_dir: Path, rows: list[dict], how: str, exists: bool) -> tuple[Path, str]:
    """A dataset folder with one good row and one row whose image path leads out of the folder (`how`: absolute,
    dotdot, symlink) to a file that exists or not; returns (folder, the bad row's image value)."""
    folder, outside = tmp_path / "ds", tmp_path / "private"
    _with_images(folder, sample_dir)
    outside.mkdir()
    target = outside / ("secret.png" if exists else "nothing.png")
    if exists:
        shutil.copy(sample_dir / rows[1]["image"], target)
    value = {"absolute": str(target), "dotdot": f"images/../../private/{target.name}", "symlink": "images/link.png"}[how]
    if how == "symlink":
        (folder / "images" / "link.png").symlink_to(target)
    _write_jsonl(folder / "problems.jsonl", [rows[0], dict(rows[1], image=value)])
    return folder, value


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_an_image_path_out_of_the_dataset_folder_is_refused_and_the_message_does_not_tell_if_it_exists(
        sample_dir, rows, tmp_path, how):
    messages = {}
    for exists in (True, False):
        folder, value = _outside_case(tmp_path / str(exists), sample_dir, rows, how, exists)
        with pytest.raises(DataError) as error:
            load_problems(folder)
        message = str(error.value)
        assert message.startswith(f"{folder / 'problems.jsonl'}: row 1 (id '{rows[1]['id']}'): image path ")
        assert ("is absolute" if how == "absolute" else "leads outside the dataset folder") in message
        assert "dataset_allow_outside_paths=true" in message and "--allow-outside-paths" in message
        messages[exists] = message.replace(str(tmp_path / str(exists)), "ROOT").replace("secret", "nothing")
    assert messages[True] == messages[False]  # the same words whether the outside file exists or not
    allowed = load_problems(tmp_path / "True" / "ds", allow_outside_paths=True)  # the explicit option
    assert _same_pixels(allowed[1].image_path, tmp_path / "True" / "private" / "secret.png")  # read from outside
    with pytest.raises(DataError, match="not found"):
        load_problems(tmp_path / "False" / "ds", allow_outside_paths=True)


def _same_pixels(loaded: Path, source: Path) -> bool:
    """The loaded RGB PNG shows the source's pixels (the samples' images are opaque: RGBA or RGB alike)."""
    from PIL import Image

    with Image.open(loaded) as got, Image.open(source) as want:
        return got.format == "PNG" and got.mode == "RGB" and got.tobytes() == want.convert("RGB").tobytes()


def test_a_symlink_and_dotdot_that_stay_inside_the_folder_are_read(sample_dir, rows, tmp_path):
    folder = _with_images(tmp_path / "ds", sample_dir)
    (folder / "alias.png").symlink_to(folder / rows[1]["image"])
    _write_jsonl(folder / "problems.jsonl", [dict(rows[0], image=f"images/../{rows[0]['image']}"),
                                            dict(rows[1], image="alias.png")])
    assert len(load_problems(folder)) == 2


def test_hf_schema_files_and_in_memory_datasets_keep_paths_inside_too(sample_dir, rows, provenance, tmp_path):
    folder = _with_images(tmp_path / "ds", sample_dir)
    absolute = _geometry3k_rows(sample_dir, rows, provenance, as_bytes=False)[:1]
    absolute[0]["images"] = [str(sample_dir / absolute[0]["images"][0])]
    parquet = folder / "g.parquet"
    pq.write_table(pa.Table.from_pylist(absolute), parquet)
    with pytest.raises(DataError, match=r"g\.parquet: row 0 .*is absolute"):
        load_problems(parquet)
    r1v = [dict(_r1v_rows(sample_dir, rows)[0], image={"bytes": None, "path": "../elsewhere.png"})]
    with pytest.raises(DataError, match=r"r\.jsonl: row 0 .*leads outside the dataset folder"):
        load_problems(_write_jsonl(folder / "r.jsonl", r1v))
    datasets = pytest.importorskip("datasets")
    in_memory = datasets.Dataset.from_list([dict(r1v[0], image=str(sample_dir / rows[0]["image"]))])
    with pytest.raises(DataError, match="a hub dataset has no folder for paths to stay in"):
        load_hf_dataset(in_memory, where="hub[train]")
    assert len(load_hf_dataset(in_memory, where="hub[train]", allow_outside_paths=True)) == 1


def _huge_png(path: Path, side: int = 12000) -> Path:
    """A valid grey side x side PNG written row by row (small on disk; ~side² bytes once decoded)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer, row = zlib.compressobj(9), b"\x00" + b"\x7f" * side
    pixels = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))
    return path


def test_an_image_over_the_pixel_limit_is_refused_from_its_header(sample_dir, rows, tmp_path, caplog):
    from PIL import Image

    from fastrl_core.data import problems as problems_module

    folder = _with_images(tmp_path / "ds", sample_dir)
    _huge_png(folder / "huge.png")
    with pytest.warns(Image.DecompressionBombWarning), Image.open(folder / "huge.png") as image:
        assert image.size == (12000, 12000)  # a real PNG: PIL opens it (with a warning, no more)
    _write_jsonl(folder / "problems.jsonl", [rows[0], dict(rows[1], image="huge.png"), rows[2]])
    decoded = []
    original_load = Image.Image.load
    with pytest.MonkeyPatch.context() as patch:  # no pixel of it is decoded: its header says enough
        patch.setattr(Image.Image, "load", lambda self: (decoded.append(self.size), original_load(self))[1])
        with pytest.raises(DataError) as error:
            load_problems(folder)
    assert (12000, 12000) not in decoded
    assert str(error.value) == (f"{folder / 'problems.jsonl'}: row 1 (id '{rows[1]['id']}'): image 'huge.png' is "
                                "12000x12000 (144,000,000 pixels), over the limit of 16,777,216 pixels (4096x4096): "
                                "downscale it")
    with caplog.at_level(logging.WARNING):
        loaded = load_problems(folder, skip_bad=True)
    assert [p.id for p in loaded] == [rows[0]["id"], rows[2]["id"]]
    assert caplog.text.count("refused 1 images over 16,777,216 pixels") == 1  # once per dataset, with a count
    embedded = tmp_path / "embedded.parquet"
    pq.write_table(pa.Table.from_pylist([dict(_r1v_rows(sample_dir, rows)[0], image={
        "bytes": (folder / "huge.png").read_bytes(), "path": None})]), embedded)
    with pytest.raises(DataError, match=r"embedded image is 12000x12000 .*over the limit"):
        load_problems(embedded, image_cache=tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # never stored
    assert problems_module.MAX_IMAGE_PIXELS == 4096 * 4096
