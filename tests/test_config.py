import pytest

from fastrl_core.config import TrainConfig, load_config


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
    "overrides, error, text",
    [
        (["stepz=3"], KeyError, "unknown config key 'stepz'; valid keys: accuracy_weight"),
        (["steps=abc"], ValueError, "steps expects int"),
        (["lr"], ValueError, "not key=value"),
        (["steps.x=1"], KeyError, "has no sub-keys"),
        (["log_rollouts=3"], ValueError, "expects bool"),
    ],
)
def test_bad_overrides_name_the_key(overrides, error, text):
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, overrides)


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("stepz: 1\n")
    with pytest.raises(KeyError, match="bad.yaml: unknown config key 'stepz'"):
        load_config(path)
