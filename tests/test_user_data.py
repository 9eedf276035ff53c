"""A user's own data (issue 53): every image Pillow reads trains, and every input training cannot take is refused at
load in one line naming the file, row and id (exit 2 from `fastrl train`), or skipped and counted with
`dataset_skip_bad=true`. Also the store's side: a damaged run.json on resume, `fastrl store compact`'s summaries,
temp files a killed compact leaves, and the dashboard's `?step=` parameter.

Images are made with Pillow in tmp_path; the real-data checks read the 277 problems of ../shared/data/geo-real-sample
when that folder is present (tests/data/geometry3k-sample, its 40-problem copy, otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageDraw

from fastrl_core.config import ConfigError
from fastrl_core.data import problems as problems_module
from fastrl_core.data.problems import MAX_ASPECT_RATIO, DataError, load_problems, max_line_bytes, text_limit
from fastrl_core.run_config import load_config

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "tests" / "data" / "geometry3k-sample"
SHARED = REPO.parent / "shared" / "data" / "geo-real-sample"
if not SHARED.is_dir():
    SHARED = Path("/work/shared/data/geo-real-sample")
REAL = SHARED if SHARED.is_dir() else SHIPPED


@pytest.fixture(autouse=True)
def image_cache(tmp_path, monkeypatch) -> Path:
    """Converted images go to a cache in tmp_path, not the user's ~/.cache/fastrl/images."""
    cache = tmp_path / "image-cache"
    monkeypatch.setattr(problems_module, "DEFAULT_IMAGE_CACHE", cache)
    return cache


def _diagram(mode: str = "RGB", size: tuple[int, int] = (64, 48)) -> Image.Image:
    """A white diagram with a black line, in `mode`."""
    image = Image.new("RGB", size, "white")
    ImageDraw.Draw(image).line((4, 4, size[0] - 4, size[1] - 4), fill="black", width=3)
    return image.convert(mode)


def _dataset(folder: Path, images: dict[str, Image.Image | bytes], rows: list[dict] | None = None,
             **save_args) -> Path:
    """A problems.jsonl + images/ folder, one row per image (id p<i>, answer "3"), `rows` instead when given."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    for name, image in images.items():
        if isinstance(image, bytes):
            (folder / "images" / name).write_bytes(image)
        else:
            image.save(folder / "images" / name, **save_args.get(name, {}))
    if rows is None:
        rows = [{"id": f"p{i}", "question": "How many lines?", "answer": "3", "image": f"images/{name}"}
                for i, name in enumerate(images)]
    (folder / "problems.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def _rgb(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        assert (image.format, image.mode, getattr(image, "n_frames", 1)) == ("PNG", "RGB", 1), path
        return np.asarray(image)


# ---------------------------------------------------------------------------------------------------- images

def _animated_gif() -> bytes:
    """Two frames: black first, then white (palette images)."""
    import io

    frames = [Image.new("P", (40, 30), 0), Image.new("P", (40, 30), 1)]
    frames[0].putpalette([0, 0, 0, 255, 255, 255] + [0] * 762)
    frames[1].putpalette([0, 0, 0, 255, 255, 255] + [0] * 762)
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=100)
    return buffer.getvalue()


def _transparent(mode: str) -> Image.Image:
    """A transparent image whose colour under the transparency is black, with one opaque black pixel at (0, 0):
    RGBA and LA by their alpha, P by a transparent palette entry (black, like the opaque one)."""
    if mode == "P":
        image = Image.new("P", (40, 30), 1)
        image.putpalette([0, 0, 0, 0, 0, 0])
        image.putpixel((0, 0), 0)
        image.info["transparency"] = 1
        return image
    image = Image.new("RGBA", (40, 30), (0, 0, 0, 0))
    image.putpixel((0, 0), (0, 0, 0, 255))
    return image.convert(mode)


def test_every_format_and_mode_pillow_reads_becomes_one_rgb_png(tmp_path, image_cache):
    """JPEG (RGB, CMYK, grey), GIF (animated: its first frame), PNG (RGBA and palette with transparency, grey with
    alpha, 16-bit), WebP, TIFF, BMP (1 bit): each problem's image is a single-frame RGB PNG showing what the source
    shows; transparency is white. Today a JPEG reached the store as JPEG bytes and the run died at step 0."""
    sixteen = Image.fromarray(np.full((30, 40), 65535 // 2, dtype=np.uint16))  # mid grey, 16 bits
    images = {"rgb.jpg": _diagram(), "cmyk.jpg": _diagram("CMYK"), "grey.jpg": _diagram("L"),
              "anim.gif": _animated_gif(), "rgba.png": _transparent("RGBA"), "palette.png": _transparent("P"),
              "la.png": _transparent("LA"), "sixteen.png": sixteen, "photo.webp": _diagram(),
              "scan.tiff": _diagram(), "bits.bmp": _diagram("1")}
    loaded = load_problems(_dataset(tmp_path / "ds", images))
    assert len(loaded) == len(images)
    by_name = dict(zip(images, loaded))
    for name, problem in by_name.items():
        pixels = _rgb(problem.image_path)
        assert problem.image_path.parent == image_cache  # converted once, into the cache
        assert problem.load_image().size == pixels.shape[1::-1]
        if name.endswith(".jpg") or name in ("photo.webp", "scan.tiff", "bits.bmp"):  # the diagram survives
            assert pixels[0, -1].min() > 200 and pixels[24, 32].max() < 80, name
    assert (_rgb(by_name["anim.gif"].image_path) == 0).all()  # the first (black) frame, not the white one
    for name in ("rgba.png", "palette.png", "la.png"):  # transparent -> white, the opaque pixel stays black
        pixels = _rgb(by_name[name].image_path)
        assert (pixels[5, 5] == 255).all() and (pixels[0, 0] == 0).all(), name
    assert abs(int(_rgb(by_name["sixteen.png"].image_path)[0, 0, 0]) - 127) <= 1  # scaled, not clipped to 255


def test_an_rgb_png_is_used_as_it_is_and_a_converted_image_is_encoded_once(tmp_path, image_cache, monkeypatch):
    folder = _dataset(tmp_path / "ds", {"a.png": _diagram(), "b.jpg": _diagram()})
    encoded = []
    real_png = problems_module._png
    monkeypatch.setattr(problems_module, "_png", lambda image: encoded.append(image.size) or real_png(image))
    first = load_problems(folder)
    assert first[0].image_path == (folder / "images" / "a.png").resolve()  # already the store's format: no copy
    assert first[1].image_path.parent == image_cache and len(encoded) == 1
    again = load_problems(folder)
    assert again[1].image_path == first[1].image_path and len(encoded) == 1  # found in the cache, not re-encoded
    assert sorted(p.name for p in image_cache.iterdir()) == [first[1].image_path.name]  # no temp file left


def test_an_exif_rotated_photo_is_turned_upright(tmp_path):
    exif = Image.Exif()
    exif[problems_module.ORIENTATION] = 6  # the camera was turned: show it rotated 90 degrees clockwise
    folder = _dataset(tmp_path / "ds", {"photo.jpg": _diagram(size=(64, 32))},
                      **{"photo.jpg": {"exif": exif.tobytes()}})
    assert _rgb(load_problems(folder)[0].image_path).shape == (64, 32, 3)  # (height, width): upright


def test_jpeg_bytes_in_geometry3k_schema_parquet_load_as_png(tmp_path, image_cache):
    """Geometry3K's schema (images as {bytes, path}) with JPEG bytes: today they went to the store as JPEG."""
    import io

    rows = []
    for i in range(3):
        buffer = io.BytesIO()
        _diagram().save(buffer, format="JPEG")
        rows.append({"images": [{"bytes": buffer.getvalue(), "path": f"{i}.jpg"}], "problem": f"<image>Find x. {i}",
                     "answer": "3", "choices": ["1", "2", "3", "4"]})
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "g.parquet")
    loaded = load_problems(tmp_path / "g.parquet")
    assert [p.answer for p in loaded] == ["C"] * 3
    assert all(p.image_path.parent == image_cache and _rgb(p.image_path).shape == (48, 64, 3) for p in loaded)


def test_the_real_sample_loads_as_rgb_pngs_with_its_own_pixels():
    """geo-real-sample: 237 RGBA, 39 RGB and 1 palette PNG with a transparency entry. Each problem's image shows the
    source's pixels laid over white by their alpha (computed here in numpy); the RGB ones are read where they are."""
    loaded = load_problems(REAL)
    rows = {row["id"]: row for row in map(json.loads, (REAL / "problems.jsonl").read_text().splitlines())}
    assert len(loaded) == len(rows) and not loaded.skipped
    kept = 0
    for problem in loaded:
        source = REAL / rows[problem.id]["image"]
        with Image.open(source) as image:
            if image.mode == "RGB":
                assert problem.image_path == source.resolve()
                kept += 1
            rgba = np.asarray(image.convert("RGBA"), dtype=np.float64)
        alpha = rgba[..., 3:] / 255
        want = rgba[..., :3] * alpha + 255 * (1 - alpha)
        assert np.abs(_rgb(problem.image_path) - want).max() <= 1, problem.id
    assert kept > 0


# ------------------------------------------------------------------------------------------- aspect and size

def _processor():
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(REPO / "fastrl_core" / "models" / "embedded").image_processor


def test_an_image_past_the_processors_aspect_ratio_is_refused_at_load(tmp_path):
    """1x4000 passed the loader and failed inside Qwen's image processor at the first rollout. The bound is the
    processor's own: it takes 1x200 and raises at 1x201."""
    processor = _processor()
    processor(images=[_diagram(size=(1, MAX_ASPECT_RATIO))])
    with pytest.raises(ValueError, match="aspect ratio must be smaller than 200"):
        processor(images=[_diagram(size=(1, MAX_ASPECT_RATIO + 1))])
    folder = _dataset(tmp_path / "ds", {"ok.png": _diagram(), "thin.png": _diagram(size=(1, 4000)),
                                        "edge.png": _diagram(size=(MAX_ASPECT_RATIO, 1))})
    with pytest.raises(DataError) as error:
        load_problems(folder)
    assert str(error.value) == (f"{folder / 'problems.jsonl'}: row 1 (id 'p1'): image 'images/thin.png' is 1x4000: "
                                "its longer side is over 200 times its shorter, which Qwen2-VL's image processor "
                                "refuses: crop or pad it")
    loaded = load_problems(folder, skip_bad=True)
    assert [p.id for p in loaded] == ["p0", "p2"] and len(loaded.skipped) == 1
    processor(images=[loaded[1].load_image()])  # what is loaded, the processor takes


# ------------------------------------------------------------------------------------------------------ text

def test_a_question_or_answer_over_the_text_limit_is_refused_and_skippable(tmp_path):
    """A 1,000,000-character question grew a run to 23 GB. The limit: max_text_chars (the loader's default
    without one)."""
    image = {"a.png": _diagram()}
    rows = [{"id": "ok", "question": "Find x.", "answer": "3", "image": "images/a.png"},
            {"id": "long", "question": "x" * 300_000, "answer": "3", "image": "images/a.png"},
            {"id": "long_answer", "question": "Find x.", "answer": "9" * 5000, "image": "images/a.png"}]
    folder = _dataset(tmp_path / "ds", image, rows)
    with pytest.raises(DataError) as error:
        load_problems(folder, max_text_chars=4096)
    assert str(error.value) == (f"{folder / 'problems.jsonl'}: row 1 (id 'long'): the question is 300,000 characters, "
                                "over the limit of 4,096 (max_text_chars)")
    loaded = load_problems(folder, max_text_chars=4096, skip_bad=True)
    assert [p.id for p in loaded] == ["ok"]
    assert loaded.skipped[1] == ("row 2 (id 'long_answer'): the answer is 5,000 characters, over the limit of 4,096 "
                                 "(max_text_chars)")
    with pytest.raises(DataError, match=r"row 1 \(id 'long'\): the question is 300,000 characters, over the limit of "
                                        r"131,072"):
        load_problems(folder)  # no limit given: the loader's default
    assert len(load_problems(folder, max_text_chars=300_000, skip_bad=True)) == 3


def test_a_50_mb_line_is_refused_without_being_held(tmp_path, monkeypatch):
    folder = _dataset(tmp_path / "ds", {"a.png": _diagram()})
    good = (folder / "problems.jsonl").read_bytes()
    huge = json.dumps({"id": "huge", "question": "y" * 50_000_000, "answer": "3", "image": "images/a.png"}).encode()
    (folder / "problems.jsonl").write_bytes(good + huge + b"\n" + good.replace(b'"p0"', b'"after"'))
    reads = []
    real_loads = json.loads
    monkeypatch.setattr(problems_module.json, "loads", lambda text: reads.append(len(text)) or real_loads(text))
    loaded = load_problems(folder, skip_bad=True, max_text_chars=4096)
    assert [p.id for p in loaded] == ["p0", "after"]  # the line after it is read as its own row
    assert loaded.skipped == [f"row 1 (id 'huge'): line 2 is {len(huge) + 1:,} bytes, over the limit of "
                              f"{max_line_bytes(4096):,} for a row (max_text_chars bounds it)"]
    assert max(reads) < 1000  # never parsed


def test_text_that_is_not_utf8_or_not_json_is_a_bad_row_naming_its_line_and_id(tmp_path):
    """A 0xFF byte gave a raw UnicodeDecodeError naming no file or row, even with dataset_skip_bad=true."""
    folder = _dataset(tmp_path / "ds", {f"{i}.png": _diagram() for i in range(4)})
    lines = (folder / "problems.jsonl").read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b"How many", b"How \xff many")
    lines[2] = lines[2][:-3] + b"\n"  # cut short: not JSON
    (folder / "problems.jsonl").write_bytes(b"\xef\xbb\xbf" + lines[0] + b"\n" + b"".join(lines[1:]))  # BOM, blank
    with pytest.raises(DataError) as error:
        load_problems(folder)
    column = lines[1].index(b"\xff") + 1
    assert str(error.value) == (f"{folder / 'problems.jsonl'}: row 1 (id 'p1'): line 3 is not UTF-8 text (byte 0xff "
                                f"at column {column})")
    loaded = load_problems(folder, skip_bad=True)
    assert [p.id for p in loaded] == ["p0", "p3"]
    assert loaded.skipped[0].startswith("row 1 (id 'p1'): line 3 is not UTF-8")
    assert loaded.skipped[1].startswith("row 2 (id 'p2'): line 4 is not valid JSON (")


@pytest.mark.parametrize("answer", [float("nan"), float("inf"), "nan", "NaN"])
def test_a_nan_answer_is_refused(tmp_path, answer):
    """JSON NaN (what pandas writes for a missing value), a float NaN in Parquet, and "nan" as text."""
    folder = _dataset(tmp_path / "ds", {"a.png": _diagram(), "b.png": _diagram()})
    rows = [json.loads(line) for line in (folder / "problems.jsonl").read_text().splitlines()]
    rows[1]["answer"] = answer
    (folder / "problems.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))  # allow_nan: NaN
    with pytest.raises(DataError, match=r"row 1 \(id 'p1'\): .*(missing value|not text)"):
        load_problems(folder)
    assert [p.id for p in load_problems(folder, skip_bad=True)] == ["p0"]
    if isinstance(answer, float):  # a float column in Parquet (Geometry3K's schema)
        rows = [{"images": [{"bytes": (folder / "images/a.png").read_bytes(), "path": None}], "problem": "Find x.",
                 "answer": value} for value in (3.0, answer)]
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "g.parquet")
        with pytest.raises(DataError, match=rf"g\.parquet: row 1 .*'answer' is {answer}"):
            load_problems(tmp_path / "g.parquet")


# ---------------------------------------------------------------------------------------------------- config

def test_max_text_chars_follows_the_models_context_and_is_recorded(tmp_path):
    config = load_config("embedded", [f"store_dir={tmp_path}"])
    context = json.loads((REPO / "fastrl_core/models/embedded/config.json").read_text())["text_config"][
        "max_position_embeddings"]
    assert config.max_text_chars == text_limit(context) == 4 * context  # resolved once, recorded as the run's
    assert load_config("embedded", [f"store_dir={tmp_path}", "max_text_chars=500"]).max_text_chars == 500
    assert text_limit(None) == problems_module.DEFAULT_MAX_TEXT_CHARS
    with pytest.raises(ConfigError, match="max_text_chars=0 is out of range"):
        load_config("embedded", [f"store_dir={tmp_path}", "max_text_chars=0"])


@pytest.mark.parametrize("override, message", [
    ("synthetic_kinds=[nope]", "synthetic_kinds: 'nope' is not a synthetic task kind; valid: count_dots, "
                               "longest_segment, parallel, polygon_sides, right_angle"),
    ("synthetic_levels=[99]", "synthetic_levels: 99 is not a level of the synthetic task; valid: 1, 2"),
    ("synthetic_levels=[one]", "synthetic_levels: 'one' is not a level of the synthetic task; valid: 1, 2"),
    ("store_dir=", "store_dir='' is empty; name the store's folder (default: runs)"),
])
def test_synthetic_kinds_levels_and_an_empty_store_dir_are_refused_at_load(tmp_path, monkeypatch, override, message):
    monkeypatch.chdir(tmp_path)
    overrides = [override] if override.startswith("store_dir") else [f"store_dir={tmp_path / 's'}", override]
    with pytest.raises(ConfigError) as error:
        load_config("embedded", overrides)
    assert str(error.value) == f"command line: {message}"
    assert list(tmp_path.iterdir()) == []  # nothing written, in the store or the current folder


# ---------------------------------------------------------------------------------------------------- store

def _fake_run(store_dir: Path, *, finish: bool = True) -> str:
    from fastrl_core.store.fake_runs import write_fake_run

    return write_fake_run(store_dir, steps=2, finish=finish, prompts=2, rollouts_per_prompt=2, sketch_dim=4,
                          dataset_size=4)


@pytest.mark.parametrize("damage", [b'{"config": {"steps"', b"\xff\xfe", b"[1, 2]"])
def test_a_damaged_run_json_is_one_config_error_on_resume(tmp_path, damage):
    from fastrl_core.resume import load_resume_config

    run_id = _fake_run(tmp_path)
    (tmp_path / "runs" / run_id / "run.json").write_bytes(damage)
    with pytest.raises(ConfigError) as error:
        load_resume_config(None, [f"store_dir={tmp_path}"], run_id)
    message = str(error.value)
    assert message.startswith(f"--resume {run_id}: its record '{tmp_path / 'runs' / run_id / 'run.json'}' is "
                              "damaged (") and "\n" not in message
    assert message.endswith(f"so the run cannot resume; `fastrl store check {tmp_path}` lists the store's damage; "
                            "start a new run")


def test_store_compact_writes_the_summary_files(tmp_path):
    from fastrl_app.cli import main
    from fastrl_core.store import summary

    run_id = _fake_run(tmp_path, finish=False)  # a run still being written: no summary yet
    assert summary.summary_files(tmp_path, run_id) == []
    assert main(["store", "compact", str(tmp_path)]) == 0
    assert len(summary.summary_files(tmp_path, run_id)) == len(summary.SOURCES)
    assert all(summary.problem(tmp_path, run_id, table) is None for table in summary.SOURCES)


def test_store_check_names_the_temp_file_a_killed_compact_leaves(tmp_path):
    from fastrl_core.store import check_store, layout, quarantine

    run_id = _fake_run(tmp_path, finish=False)
    killed = subprocess.run([sys.executable, "-c", (
        "import importlib, os, sys\n"
        "c = importlib.import_module('fastrl_core.store.compact')  # the module, not the function store exports\n"
        "original = c._create_runs\n"
        "def die(con, meta):\n"
        "    original(con, meta)\n"
        "    os._exit(9)  # killed while the DuckDB file is built\n"
        "c._create_runs = die\n"
        "c.compact(sys.argv[1], sys.argv[2])\n"), str(tmp_path), run_id], capture_output=True, text=True)
    assert killed.returncode == 9, killed.stderr
    left = [p for p in (tmp_path / "runs" / run_id).iterdir() if ".tmp-" in p.name]
    assert left and not layout.compact_file(tmp_path, run_id).exists()
    live = tmp_path / "runs" / run_id / f"steps/step_000000.parquet.tmp-{os.getpid()}"  # a write in progress
    live.write_bytes(b"")
    damage = check_store(tmp_path)
    assert [d.path for d in damage] == sorted(os.path.relpath(p, tmp_path) for p in left)
    assert all(d.problem == f"a temp file left by process {_pid_in(d.path)}, which is not running (a write "
                            "killed midway; never read)" for d in damage)
    moved = quarantine(tmp_path, damage)
    assert sorted(moved) == [d.path for d in damage] and check_store(tmp_path) == []
    assert (tmp_path / "runs" / run_id / "steps" / "step_000000.parquet").exists()  # its step stays


def _pid_in(path: str) -> int:
    """The process id in a temp file's name (`<name>.tmp-<pid>[.wal]`)."""
    return int(path.rsplit(".tmp-", 1)[1].removesuffix(".wal"))


# ----------------------------------------------------------------------------------------------- dashboard

@pytest.mark.parametrize("text, number", [("3", 3), ("-1", -1), ("--1", None), ("1.5", None), ("²", None),
                                          ("", None), (None, None), ("9" * 40, None), ("１", None)])
def test_a_query_parameter_is_read_as_a_number_only_when_it_is_one(text, number):
    from fastrl_app.widgets import query_int

    assert query_int(text) == number


def test_the_rollouts_page_takes_any_step_parameter(tmp_path, monkeypatch):
    """/rollouts?step=--1 raised ValueError on the page (int("--1") after a check that stripped the dashes)."""
    from streamlit.testing.v1 import AppTest

    import fastrl_app

    run_id = _fake_run(tmp_path)
    monkeypatch.setenv("FASTRL_STORE", str(tmp_path))
    for step in ("--1", "²", "1e3"):
        at = AppTest.from_file(str(Path(fastrl_app.__file__).parent / "main.py"), default_timeout=60)
        at.query_params.update(run=run_id, step=step)
        at.switch_page("views/rollouts.py")
        at.run()
        assert not at.exception, [e.message for e in at.exception]
        assert any(f"which run `{run_id}` does not have" in w.value for w in at.warning), step


# -------------------------------------------------------------------------------------- training, end to end

def test_a_jpeg_folder_dataset_trains_a_step_and_the_store_keeps_pngs(tmp_path):
    from fastrl_core import store
    from fastrl_core.trainer import Trainer

    folder = _dataset(tmp_path / "ds", {f"{i}.jpg": _diagram(size=(56 + 8 * i, 56)) for i in range(4)})
    config = load_config("embedded", [f"store_dir={tmp_path / 'store'}", f"dataset={folder}", "steps=1",
                                      "prompts_per_step=4", "rollouts_per_prompt=2", "eval_every=0",
                                      "checkpoint_every=0", "threads=1", "max_new_tokens=8"])
    trainer = Trainer(config, progress=False)
    trainer.train_step()
    trainer.writer.finish()
    run_id = trainer.writer.run_id
    refs = set(store.read_rollouts(tmp_path / "store", run_id, columns=["image_ref"])["image_ref"])
    assert len(refs) == 4
    for ref in refs:
        png = store.read_image(tmp_path / "store", run_id, ref)
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and store.image_key(png) == ref


# ------------------------------------------------------------------------------------------------------ CLI

def _fastrl(tmp_path: Path, *args: str) -> str:
    """`fastrl <args>` in a subprocess (HOME in tmp_path: no cache outside it); its one stderr line, after checking
    exit code 2, no traceback and nothing on stdout."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "fastrl_app.cli", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "HOME": str(home)})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastrl: error: "), done.stderr
    return lines[0]


@pytest.mark.parametrize("case", ["long question", "non-UTF-8 byte", "1x4000 image", "NaN answer"])
def test_fastrl_train_refuses_bad_data_in_one_line_with_exit_2(tmp_path, case):
    folder = _dataset(tmp_path / "ds", {f"{i}.jpg": _diagram() for i in range(6)} | {"thin.png": _diagram(
        size=(1, 4000))})
    lines = (folder / "problems.jsonl").read_bytes().splitlines(keepends=True)
    edit = {"long question": lambda line: line.replace(b"How many lines?", b"x" * 300_000),
            "non-UTF-8 byte": lambda line: line.replace(b"How many", b"How \xff many"),
            "1x4000 image": lambda line: line.replace(b"images/3.jpg", b"images/thin.png"),
            "NaN answer": lambda line: line.replace(b'"answer": "3"', b'"answer": NaN')}[case]
    lines[3] = edit(lines[3])
    (folder / "problems.jsonl").write_bytes(b"".join(lines[:6]))
    store_dir = tmp_path / "store"
    line = _fastrl(tmp_path, "train", f"dataset={folder}", f"store_dir={store_dir}", "prompts_per_step=4")
    assert line.startswith(f"fastrl: error: {folder / 'problems.jsonl'}: row 3 (id 'p3'): ")
    column = lines[3].find(b"\xff") + 1
    assert {"long question": "the question is 300,000 characters, over the limit of 4,096 (max_text_chars)",
            "non-UTF-8 byte": f"line 4 is not UTF-8 text (byte 0xff at column {column})",
            "1x4000 image": "image 'images/thin.png' is 1x4000: its longer side is over 200 times its shorter",
            "NaN answer": "'answer' is nan"}[case] in line
    assert not store_dir.exists()  # refused before the store, a model or the synthetic data


def test_fastrl_eval_bounds_text_by_the_models_context_as_train_does(tmp_path):
    """`fastrl eval` read a dataset with the loader's default limit (131,072 characters), not the model's: a question
    that `fastrl train` refuses was tokenised whole. Now the same one line, before the model loads; a larger
    `--max-text-chars` lets it through to the loader's other checks."""
    folder = _dataset(tmp_path / "ds", {f"{i}.png": _diagram() for i in range(3)})
    lines = (folder / "problems.jsonl").read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b"How many lines?", b"x" * 20_000)
    (folder / "problems.jsonl").write_bytes(b"".join(lines[:3]))
    line = _fastrl(tmp_path, "eval", "--dataset", str(folder), "--store", str(tmp_path / "store"))
    assert line == (f"fastrl: error: {folder / 'problems.jsonl'}: row 1 (id 'p1'): the question is 20,000 "
                    "characters, over the limit of 4,096 (max_text_chars)")
    line = _fastrl(tmp_path, "eval", "--dataset", str(folder), "--max-text-chars", "0")
    assert line == "fastrl: error: --max-text-chars 0: must be at least 1"
    assert not (tmp_path / "store").exists()


def test_fastrl_train_resume_of_a_damaged_run_json_is_one_line(tmp_path):
    run_id = _fake_run(tmp_path / "store")
    (tmp_path / "store" / "runs" / run_id / "run.json").write_text('{"config": {')
    line = _fastrl(tmp_path, "train", "--resume", run_id, f"store_dir={tmp_path / 'store'}")
    assert line.startswith(f"fastrl: error: --resume {run_id}: its record ") and "is damaged (" in line


def test_the_next_writer_removes_the_store_database_temp_file_a_killed_process_left(tmp_path):
    """A process killed while it rebuilt `store.duckdb` leaves `store.duckdb.tmp-<pid>[.wal]` at the store's top,
    outside every run folder: `store check` names it as a temp file (not damaged data), and the next writer removes
    it while a live process's temp file stays (the fault-injection campaign found two left at its end)."""
    from fastrl_core.store import check_store, layout

    run_id = _fake_run(tmp_path, finish=False)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = [tmp_path / f"store.duckdb.tmp-{int(dead.stdout)}", tmp_path / f"store.duckdb.tmp-{int(dead.stdout)}.wal"]
    live = tmp_path / f"store.duckdb.tmp-{os.getppid()}"  # a write in progress (this test's parent is running)
    for path in (*left, live):
        path.write_bytes(b"junk")
    damage = check_store(tmp_path)
    assert [d.path for d in damage] == sorted(p.name for p in left) and all(d.temp_file for d in damage)
    layout.init_store(tmp_path)
    assert not any(p.exists() for p in left) and live.exists() and check_store(tmp_path) == []
    assert run_id in layout.list_runs(tmp_path)


def test_the_next_writer_removes_the_temp_run_json_a_writer_killed_before_its_run_existed_left(tmp_path):
    """A writer killed between claiming its run folder and renaming its run.json into place leaves
    `runs/<id>/run.json.tmp-<pid>` in a folder no `--resume` can name: `store check` names the temp file, and the next
    writer removes it, while a live process's temp file in a just-claimed folder stays (CI's fault-injection campaign
    found one at its end after a kill "before the run existed")."""
    from fastrl_core.store import check_store, layout

    run_id = _fake_run(tmp_path, finish=False)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    unborn, claimed = tmp_path / "runs" / "demo-20261207-101010", tmp_path / "runs" / "demo-20261207-101011"
    unborn.mkdir()
    claimed.mkdir()
    left = unborn / f"run.json.tmp-{int(dead.stdout)}"
    live = claimed / f"run.json.tmp-{os.getppid()}"  # a writer that has just claimed its folder
    left.write_bytes(b'{"run_id": ')
    live.write_bytes(b'{"run_id": ')
    assert [d.path for d in check_store(tmp_path)] == [str(left.relative_to(tmp_path))]
    layout.init_store(tmp_path)
    assert not left.exists() and live.exists() and check_store(tmp_path) == []
    assert layout.list_runs(tmp_path) == [run_id]
