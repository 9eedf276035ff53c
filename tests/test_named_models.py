"""Named models (fastrl_core.named_models): `fastrl warmstart --preset` builds a warm start of the preset's widths into
the user cache once, the name is checked when a config loads, a build that dies leaves nothing behind, and the
engine choice reads the preset's widths before it is built. The train-on-first-use path with the real vLLM is in
tests/test_vllm_engine.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastrl_app.cli import main
from fastrl_core import named_models
from fastrl_core.policy import WIDE_WIDTHS, load_policy
from fastrl_core.shipped import EMBEDDED_MODEL

# the preset's recipe at a size CI can build in seconds: same widths and tokenizer, two SFT steps on a few problems
SMALL = ["--n-train", "24", "--n-test", "8", "--max-steps", "2", "--eval-every", "1", "--batch-size", "4",
         "--band-low", "0", "--band-high", "1", "--min-format", "0", "--max-new-tokens", "4", "--threads", "1"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "fastrl"


def _small_overrides() -> dict:
    from fastrl_core.warmstart import parse_args

    defaults, given = parse_args([]), parse_args(SMALL)
    return {k: v for k, v in vars(given).items() if v != getattr(defaults, k)}


def test_preset_builds_a_loadable_model_of_its_widths_once(cache, capsys, monkeypatch):
    assert main(["warmstart", "--preset", "wide", *SMALL]) == 0
    folder = named_models.preset_dir("wide", named_models.preset_args("wide", **_small_overrides()))
    assert folder.parent == cache / "warmstart" and folder.name.startswith("wide-")
    assert capsys.readouterr().out.strip().endswith(f"embedded-wide: {folder}")
    policy = load_policy(folder)
    text = policy.model.config.text_config
    assert (text.hidden_size, text.num_hidden_layers, text.intermediate_size, text.num_attention_heads) == (
        WIDE_WIDTHS.hidden_size, WIDE_WIDTHS.num_layers, WIDE_WIDTHS.intermediate_size, WIDE_WIDTHS.num_heads)
    shipped = load_policy("embedded")
    assert policy.tokenizer.get_vocab() == shipped.tokenizer.get_vocab()  # the same tokenizer and image size
    assert policy.processor.image_processor.to_dict() == shipped.processor.image_processor.to_dict()
    meta = json.loads((folder / "warmstart.json").read_text())
    assert meta["args"]["widths"] == "wide" and meta["args"]["kinds"] == "count_dots,longest_segment"
    assert not list(folder.parent.glob(".*building"))

    def no_second_build(*args, **kwargs):
        raise AssertionError("the cached warm start was built again")

    monkeypatch.setattr("fastrl_core.warmstart.warmstart", no_second_build)
    assert main(["warmstart", "--preset", "wide", *SMALL]) == 0
    assert f"embedded-wide: already built, in {folder}" in capsys.readouterr().out


def test_a_build_that_dies_leaves_no_model_and_the_next_call_builds_it(cache, monkeypatch):
    import fastrl_core.warmstart as warmstart_module

    real = warmstart_module.warmstart

    def dies_after_writing(args, progress=True):
        Path(args.out).mkdir(parents=True)
        (Path(args.out) / "config.json").write_text("{}")  # half a model
        raise KeyboardInterrupt

    monkeypatch.setattr(warmstart_module, "warmstart", dies_after_writing)
    overrides = _small_overrides()
    with pytest.raises(KeyboardInterrupt):
        named_models.ensure_preset("wide", log=lambda line: None, **overrides)
    folder = named_models.preset_dir("wide", named_models.preset_args("wide", **overrides))
    assert not folder.exists() and not list(folder.parent.glob(".*building"))
    monkeypatch.setattr(warmstart_module, "warmstart", real)
    lines = []
    assert named_models.ensure_preset("wide", log=lines.append, progress=False, **overrides) == folder
    assert lines[0].startswith("model embedded-wide is not in the cache yet: building it now (`fastrl warmstart "
                               "--preset wide`") and lines[1].startswith("built embedded-wide in ")
    assert (folder / "model.safetensors").is_file()


def test_preset_flags_are_checked(cache, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["warmstart", "--preset", "wide", "--out", "x"])
    assert stopped.value.code == 2 and "out and data_dir are the cache's" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["warmstart", "--preset", "nope"])
    assert not cache.exists()


def test_recipe_key_follows_the_recipe_not_the_folders(cache):
    base = named_models.preset_args("wide")
    assert named_models.preset_dir("wide") == named_models.preset_dir("wide", base)
    assert named_models.recipe_key(base) == named_models.recipe_key(base.__class__(**{**vars(base), "out": "elsewhere"}))
    assert named_models.preset_dir("wide", named_models.preset_args("wide", lr=1e-4)) != named_models.preset_dir("wide")


def test_config_names_a_model_that_exists(tmp_path):
    from fastrl_core.config import ConfigError
    from fastrl_core.run_config import load_config

    assert load_config(None, ["model=embedded-wide"]).model == "embedded-wide"  # checked, not built
    with pytest.raises(ConfigError, match=r"model: 'embedded-wdie' names no warm start; named models: embedded, "
                                          r"embedded-wide"):
        load_config(None, ["model=embedded-wdie"])


def test_engine_choice_reads_the_presets_widths_before_it_is_built(cache):
    from fastrl_core.named_models import model_config_value

    assert not cache.exists()
    shipped_vocabulary = json.loads((EMBEDDED_MODEL / "config.json").read_text())["text_config"]["vocab_size"]
    assert model_config_value("embedded-wide") == WIDE_WIDTHS.hidden_size == 512
    assert model_config_value("embedded-wide", "vocab_size") == shipped_vocabulary
    assert model_config_value("embedded") == 128


def test_a_named_model_is_loaded_by_its_folder_never_as_a_path():
    """`load_policy("embedded-wide")` would look for a folder of that name: it says where the folder comes from."""
    from fastrl_core.shipped import model_path as shipped_model_path

    with pytest.raises(ValueError, match=r"'embedded-wide' is a named model, built on first use: pass "
                                         r"fastrl_core\.named_models\.model_path\('embedded-wide'\)"):
        load_policy("embedded-wide")
    assert shipped_model_path("embedded").is_dir() and named_models.model_path("Qwen/x") == "Qwen/x"
