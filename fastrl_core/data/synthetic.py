"""The embedded synthetic geometry task: small diagrams whose questions can only be answered from the image.

Design (docs/notes.md §2, measured on a ~0.6 M-param Qwen2.5-VL with 112x112 images):
- grey background near the CLIP mean (123, 117, 104) with dark strokes (white backgrounds were unlearnable);
- multiple-choice options in a fixed order (shuffled options stayed at chance) or numeric answers;
- no reading of numbers and no arithmetic (beyond that size); counting 1-4 dots was learnable, polygon sides
  got stuck at ~50 %, so the mix weights the learnable kinds and keeps harder levels to show where it stops.

Kinds (answers: a number, or a letter for fixed-order choices; yes/no is multiple choice A. yes  B. no):

| kind            | question                                | level 1                      | level 2                      |
|-----------------|-----------------------------------------|------------------------------|------------------------------|
| count_dots      | How many dots are there?                | 1-4 dots                     | 1-6 dots                     |
| polygon_sides   | How many sides does the polygon have?   | 3-4 sides                    | 3-6 sides                    |
| right_angle     | Is this a right triangle? (yes/no)      | if not, 20-45 deg from 90    | if not, 8-15 deg from 90     |
| longest_segment | Which segment is the longest? (colour)  | red top / blue bottom, >=1.5x| red/blue/green, tilted, >=1.15x |
| parallel        | Are the two lines parallel? (yes/no)    | if not, 20-40 deg apart      | if not, 6-12 deg apart       |

`DEFAULT_MIX` weights (kind, level) pairs: count_dots L1 4, longest_segment L1 2, every other pair 1 (sum 14), so
~29 % of problems are 1-4 dot counts (learnable, docs/notes.md §2) and guessing uniformly scores ~37.5 %. A split's
problems are allocated to the pairs in proportion (largest remainder), so every split has the same mix.
Everything is deterministic by seed: each problem draws from its own `random.Random(f"{seed}/{split}/{index}/
{attempt}")` and PNGs are written without metadata.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from PIL import Image, ImageDraw

from fastrl_core.algo.registry import Registry
from fastrl_core.data.problems import LETTERS, with_choices

GENERATOR_VERSION = 1  # bump when the drawings change: ensure_dataset's cache key includes it (and the mix)
BACKGROUND = (123, 117, 104)  # near the CLIP image mean
INK = (25, 25, 25)
COLOURS = {"red": (150, 20, 20), "blue": (20, 40, 160), "green": (20, 110, 30)}
SUPERSAMPLE = 4  # draw at 4x and box-downsample: smooth edges, still deterministic
YES_NO = ("yes", "no")

# Weight of each (kind, level) in the default dataset: the learnable kinds (counting few dots, the longest of two
# segments) weigh most; the others show where a tiny model stops.
DEFAULT_MIX: dict[tuple[str, int], float] = {
    ("count_dots", 1): 4,
    ("count_dots", 2): 1,
    ("polygon_sides", 1): 1,
    ("polygon_sides", 2): 1,
    ("right_angle", 1): 1,
    ("right_angle", 2): 1,
    ("longest_segment", 1): 2,
    ("longest_segment", 2): 1,
    ("parallel", 1): 1,
    ("parallel", 2): 1,
}


@dataclass(frozen=True)
class Dot:
    x: float  # centre, in units of the image side (0..1)
    y: float
    r: float
    colour: tuple[int, int, int] = INK


@dataclass(frozen=True)
class Segment:
    x0: float
    y0: float
    x1: float
    y1: float
    width: float = 0.025
    colour: tuple[int, int, int] = INK

    @property
    def length(self) -> float:
        return math.hypot(self.x1 - self.x0, self.y1 - self.y0)


@dataclass(frozen=True)
class Outline:
    """A closed polygon outline."""

    points: tuple[tuple[float, float], ...]
    width: float = 0.025
    colour: tuple[int, int, int] = INK


Shape = Dot | Segment | Outline


@dataclass(frozen=True)
class Scene:
    """What a generator draws and asks; `answer_value` is a number as text or one of `choices`."""

    question: str
    answer_value: str
    choices: tuple[str, ...] | None
    shapes: tuple[Shape, ...]

    @property
    def answer(self) -> str:
        return self.answer_value if self.choices is None else LETTERS[self.choices.index(self.answer_value)]


@dataclass(frozen=True)
class Kind:
    levels: tuple[int, ...]
    sample: Callable[[int, random.Random], Scene]  # (level, rng) -> scene


KINDS: Registry[Kind] = Registry("synthetic task kind")


def _kind(name: str, levels: tuple[int, ...]) -> Callable[[Callable[[int, random.Random], Scene]], Callable]:
    """Register a scene sampler `(level, rng) -> Scene` as task kind `name`."""

    def add(sample: Callable[[int, random.Random], Scene]) -> Callable[[int, random.Random], Scene]:
        KINDS.register(name)(Kind(levels, sample))
        return sample

    return add


def render(shapes: Sequence[Shape], image_size: int = 112) -> Image.Image:
    """Draw shapes on the grey background: RGB image_size x image_size."""
    side = image_size * SUPERSAMPLE
    image = Image.new("RGB", (side, side), BACKGROUND)
    draw = ImageDraw.Draw(image)

    def px(v: float) -> float:
        return v * side

    for shape in shapes:
        if isinstance(shape, Dot):
            draw.ellipse([px(shape.x - shape.r), px(shape.y - shape.r), px(shape.x + shape.r), px(shape.y + shape.r)],
                         fill=shape.colour)
        elif isinstance(shape, Segment):
            _thick_polyline(draw, [(px(shape.x0), px(shape.y0)), (px(shape.x1), px(shape.y1))], px(shape.width),
                            shape.colour, closed=False)
        elif isinstance(shape, Outline):
            _thick_polyline(draw, [(px(x), px(y)) for x, y in shape.points], px(shape.width), shape.colour,
                            closed=True)
        else:
            raise TypeError(f"cannot draw {shape!r}")
    return image.reduce(SUPERSAMPLE)


def _thick_polyline(draw: ImageDraw.ImageDraw, points: list[tuple[float, float]], width: float,
                    colour: tuple[int, int, int], *, closed: bool) -> None:
    """A polyline with round joints and caps (each vertex gets a disc of the line's width)."""
    path = points + points[:1] if closed else points
    draw.line(path, fill=colour, width=max(1, round(width)))
    r = width / 2
    for x, y in points:
        draw.ellipse([x - r, y - r, x + r, y + r], fill=colour)


def generate_problem(kind: str, level: int, rng: random.Random, *, image_size: int = 112) -> tuple[dict, Image.Image]:
    """One problem of `kind` at `level`: its record (question, choices, answer, answer_value, kind, level) and image."""
    entry = KINDS.get(kind)
    if level not in entry.levels:
        raise ValueError(f"{kind!r} has levels {list(entry.levels)}, not {level!r}")
    scene = entry.sample(level, rng)
    record = {
        "question": with_choices(scene.question, scene.choices),
        "choices": list(scene.choices) if scene.choices is not None else None,
        "answer": scene.answer,
        "answer_value": scene.answer_value,
        "kind": kind,
        "level": level,
    }
    return record, render(scene.shapes, image_size)


# ---- kinds -------------------------------------------------------------------------------------------------------

def _spread_points(n: int, rng: random.Random, *, margin: float, min_distance: float) -> list[tuple[float, float]]:
    """n points in [margin, 1 - margin]^2, pairwise at least min_distance apart (rejection sampling)."""
    for _ in range(1000):
        points: list[tuple[float, float]] = []
        for _ in range(200 * n):
            p = (rng.uniform(margin, 1 - margin), rng.uniform(margin, 1 - margin))
            if all(math.dist(p, q) >= min_distance for q in points):
                points.append(p)
                if len(points) == n:
                    return points
    raise RuntimeError(f"could not place {n} points {min_distance} apart")


@_kind("count_dots", (1, 2))
def _count_dots(level: int, rng: random.Random) -> Scene:
    n = rng.randint(1, 4 if level == 1 else 6)
    radius = 0.055
    points = _spread_points(n, rng, margin=0.12, min_distance=4 * radius)
    return Scene("How many dots are there?", str(n), None, tuple(Dot(x, y, radius) for x, y in points))


def _fit_in_box(points: list[tuple[float, float]], rng: random.Random, *, low: float = 0.14,
                high: float = 0.86) -> tuple[tuple[float, float], ...]:
    """Scale and shift points so their bounding box spans 70-100 % of [low, high], placed at random inside it."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    span = max(max(xs) - min(xs), max(ys) - min(ys))
    scale = (high - low) * rng.uniform(0.7, 1.0) / span
    width, height = (max(xs) - min(xs)) * scale, (max(ys) - min(ys)) * scale
    left = rng.uniform(low, high - width)
    top = rng.uniform(low, high - height)
    return tuple((left + (x - min(xs)) * scale, top + (y - min(ys)) * scale) for x, y in points)


@_kind("polygon_sides", (1, 2))
def _polygon_sides(level: int, rng: random.Random) -> Scene:
    n = rng.randint(3, 4 if level == 1 else 6)
    step = 2 * math.pi / n
    start = rng.uniform(0, 2 * math.pi)
    points = [
        (math.cos(a) * r, math.sin(a) * r)
        for k in range(n)
        for a, r in [(start + k * step + rng.uniform(-0.15, 0.15) * step, rng.uniform(0.85, 1.0))]
    ]
    return Scene("How many sides does the polygon have?", str(n), None, (Outline(_fit_in_box(points, rng)),))


def _triangle(angles_deg: tuple[float, float, float], rng: random.Random) -> tuple[tuple[float, float], ...]:
    """A triangle with these interior angles at its three vertices, randomly rotated, fitted in the box."""
    alpha, beta, _ = (math.radians(a) for a in angles_deg)
    # A = (0, 0), B = (1, 0); C from the angle at A and the side AC = sin(beta) / sin(alpha + beta) (law of sines).
    ac = math.sin(beta) / math.sin(alpha + beta)
    points = [(0.0, 0.0), (1.0, 0.0), (ac * math.cos(alpha), -ac * math.sin(alpha))]
    turn = rng.uniform(0, 2 * math.pi)
    rotated = [(x * math.cos(turn) - y * math.sin(turn), x * math.sin(turn) + y * math.cos(turn)) for x, y in points]
    return _fit_in_box(rotated, rng)


@_kind("right_angle", (1, 2))
def _right_angle(level: int, rng: random.Random) -> Scene:
    is_right = rng.random() < 0.5
    if is_right:
        largest = 90.0
    elif rng.random() < 0.5:  # acute: the largest angle of a triangle is at least 60 deg
        largest = 90 - (rng.uniform(20, 28) if level == 1 else rng.uniform(8, 15))
    else:  # obtuse
        largest = 90 + (rng.uniform(25, 45) if level == 1 else rng.uniform(8, 15))
    rest = 180 - largest
    # the other two angles: each at least 20 deg and at most the largest one
    other = rng.uniform(max(20.0, rest - largest), min(largest, rest - 20.0))
    angles = [largest, other, rest - other]
    rng.shuffle(angles)
    return Scene("Is this a right triangle?", YES_NO[0] if is_right else YES_NO[1], YES_NO,
                 (Outline(_triangle((angles[0], angles[1], angles[2]), rng)),))


@_kind("longest_segment", (1, 2))
def _longest_segment(level: int, rng: random.Random) -> Scene:
    names = ("red", "blue") if level == 1 else ("red", "blue", "green")
    ratio = 1.5 if level == 1 else 1.15
    longest = rng.uniform(0.55, 0.75)
    lengths = [rng.uniform(0.2, longest / ratio) for _ in names]
    winner = rng.randrange(len(names))
    lengths[winner] = longest
    band = 1 / len(names)
    max_tilt = 0.0 if level == 1 else math.radians(15)
    shapes = []
    for k, (name, length) in enumerate(zip(names, lengths)):
        tilt = rng.uniform(-max_tilt, max_tilt)
        dx, dy = math.cos(tilt) * length / 2, math.sin(tilt) * length / 2
        cx = rng.uniform(0.1 + dx, 0.9 - dx)
        cy = band * (k + 0.5) + rng.uniform(-0.04, 0.04)
        shapes.append(Segment(cx - dx, cy - dy, cx + dx, cy + dy, colour=COLOURS[name]))
    return Scene("Which segment is the longest?", names[winner], names, tuple(shapes))


@_kind("parallel", (1, 2))
def _parallel(level: int, rng: random.Random) -> Scene:
    is_parallel = rng.random() < 0.5
    low, high = (20, 40) if level == 1 else (6, 12)
    gap = 0.0 if is_parallel else rng.choice((-1, 1)) * rng.uniform(low, high)
    # both directions within +-35 deg of horizontal, so the top and bottom segments never touch
    first = rng.uniform(max(-35.0, -35.0 - gap), min(35.0, 35.0 - gap))
    shapes = []
    for cy, angle in ((0.3, first), (0.7, first + gap)):
        length = rng.uniform(0.4, 0.6)
        dx = math.cos(math.radians(angle)) * length / 2
        dy = math.sin(math.radians(angle)) * length / 2
        cx = rng.uniform(0.4, 0.6)
        cy += rng.uniform(-0.03, 0.03)
        shapes.append(Segment(cx - dx, cy - dy, cx + dx, cy + dy))
    return Scene("Are the two lines parallel?", YES_NO[0] if is_parallel else YES_NO[1], YES_NO, tuple(shapes))


# ---- datasets ----------------------------------------------------------------------------------------------------

def dataset_mix(kinds: Sequence[str] | None = None, levels: Sequence[int] | None = None) -> dict[tuple[str, int], float]:
    """DEFAULT_MIX restricted to `kinds` and `levels` (None = all); a kind absent from DEFAULT_MIX gets weight 1."""
    for kind in kinds or ():
        KINDS.get(kind)  # unknown kind -> KeyError naming the valid ones
    mix = {
        (kind, level): DEFAULT_MIX.get((kind, level), 1.0)
        for kind in (kinds if kinds is not None else KINDS.names())
        for level in KINDS.get(kind).levels
        if levels is None or level in levels
    }
    if not mix:
        raise ValueError(f"no (kind, level) pair left for kinds={kinds} levels={levels}")
    return mix


def _allocate(n: int, mix: Mapping[tuple[str, int], float]) -> list[tuple[str, int]]:
    """n task slots split across the mix in proportion to the weights (largest remainder, ties by order)."""
    total = sum(mix.values())
    exact = {key: n * weight / total for key, weight in mix.items()}
    counts = {key: int(value) for key, value in exact.items()}
    by_remainder = sorted(mix, key=lambda key: -(exact[key] - counts[key]))
    for key in by_remainder[: n - sum(counts.values())]:
        counts[key] += 1
    return [key for key in mix for _ in range(counts[key])]


def _png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=6)
    return buffer.getvalue()


def _write_split(folder: Path, split: str, n: int, *, seed: int, mix: Mapping[tuple[str, int], float],
                 image_size: int, exclude: set[str]) -> set[str]:
    """Write folder/problems.jsonl + images/; returns the content keys (image hash + question) written."""
    (folder / "images").mkdir(parents=True)
    slots = _allocate(n, mix)
    random.Random(f"{seed}/{split}/order").shuffle(slots)
    keys: set[str] = set()
    with open(folder / "problems.jsonl", "w", encoding="utf-8", newline="\n") as out:
        for index, (kind, level) in enumerate(slots):
            for attempt in range(100):
                rng = random.Random(f"{seed}/{split}/{index}/{attempt}")
                record, image = generate_problem(kind, level, rng, image_size=image_size)
                png = _png_bytes(image)
                key = hashlib.sha256(png).hexdigest() + "\n" + record["question"]
                if key not in exclude:
                    break
            else:
                raise RuntimeError(f"{kind} level {level}: 100 draws all collided with the other split")
            keys.add(key)
            problem_id = f"synthetic_{split}_{index:05d}"
            image_name = f"images/{problem_id}.png"
            (folder / image_name).write_bytes(png)
            row = {"id": problem_id, "source": f"synthetic/{split}/seed{seed}", **record, "image": image_name}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    return keys


def write_dataset(out_dir: Path, *, n_train: int, n_test: int, seed: int = 0, kinds: Sequence[str] | None = None,
                  levels: Sequence[int] | None = None, image_size: int = 112) -> Path:
    """Write out_dir/{train,test}/problems.jsonl + images/ (the geo-real-sample layout) and out_dir/dataset.json.

    Deterministic: the same arguments give byte-identical files. Test problems never repeat a train problem
    (same image bytes and question). Written to a temp folder beside out_dir and renamed into place, so out_dir is
    either absent or complete; an existing non-empty out_dir is an error.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} exists and is not empty")
    mix = dataset_mix(kinds, levels)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    try:
        train_keys = _write_split(tmp / "train", "train", n_train, seed=seed, mix=mix, image_size=image_size,
                                  exclude=set())
        _write_split(tmp / "test", "test", n_test, seed=seed, mix=mix, image_size=image_size, exclude=train_keys)
        manifest = {
            "generator_version": GENERATOR_VERSION, "seed": seed, "n_train": n_train, "n_test": n_test,
            "image_size": image_size, "mix": [[kind, level, weight] for (kind, level), weight in mix.items()],
        }
        (tmp / "dataset.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        if out_dir.exists():
            out_dir.rmdir()
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


DEFAULT_N_TRAIN = 2048
DEFAULT_N_TEST = 256


def ensure_dataset(cache_dir: Path, *, n_train: int = DEFAULT_N_TRAIN, n_test: int = DEFAULT_N_TEST, seed: int = 0, kinds: Sequence[str] | None = None,
                   levels: Sequence[int] | None = None, image_size: int = 112) -> Path:
    """The dataset for these arguments under cache_dir/synthetic-<key>, generated on first use (key: the arguments
    and GENERATOR_VERSION), reused afterwards. Default size: 2048 train / 256 test problems."""
    args = {"v": GENERATOR_VERSION, "n_train": n_train, "n_test": n_test, "seed": seed, "image_size": image_size,
            "mix": sorted(dataset_mix(kinds, levels).items())}
    key = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:16]
    out_dir = Path(cache_dir) / f"synthetic-{key}"
    if (out_dir / "dataset.json").is_file():
        return out_dir
    try:
        return write_dataset(out_dir, n_train=n_train, n_test=n_test, seed=seed, kinds=kinds, levels=levels,
                             image_size=image_size)
    except (FileExistsError, OSError):
        if (out_dir / "dataset.json").is_file():  # another process finished it first
            return out_dir
        raise
