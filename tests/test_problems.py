"""Loading problems: real samples, the HF Geometry3K / R1-V schemas as local files, bad rows, the image cache.

Every test runs on the Geometry3K sample shipped in tests/data (40 problems, MIT), and again on the 277 problems of
../shared/data/geo-real-sample (Geometry3K + GeoQA) when that folder is present."""

import json
import logging
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
    out = []
    for row in rows:
        if row["choices"] is None:
            continue
        image = sample_dir / row["image"]
        hf = provenance[row["id"]]["hf_geometry3k_style"]
        images = [{"bytes": image.read_bytes(), "path": image.name}] if as_bytes else [str(image)]
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
    jsonl = _write_jsonl(tmp_path / "geometry3k.jsonl", _geometry3k_rows(sample_dir, rows, provenance, as_bytes=False))
    _assert_same(load_problems(jsonl, image_cache=tmp_path / "cache"), expected)


def test_r1v_schema_loads_identically(sample, sample_dir, rows, tmp_path):
    parquet = tmp_path / "geoqa.parquet"
    pq.write_table(pa.Table.from_pylist(_r1v_rows(sample_dir, rows)), parquet)
    loaded = load_problems(parquet, image_cache=tmp_path / "cache")
    _assert_free_form(loaded, sample)
    assert [p.id for p in loaded[:2]] == ["geoqa_r1v_0", "geoqa_r1v_1"] and loaded[0].kind == "GeoQA"


def test_easyr1_geoqa_schema_without_choices_is_free_form(sample_dir, rows, tmp_path):
    easy = [{"images": [str(sample_dir / r["image"])], "problem": "<image>" + r["question"],
             "answer": r["answer_value"]} for r in rows][:5]
    loaded = load_problems(_write_jsonl(tmp_path / "easy.jsonl", easy))
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
    good = [dict(r, image=str(sample_dir / r["image"])) for r in rows[:3]]
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
    row = dict(rows[0], image=str(sample_dir / rows[0]["image"]))
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
