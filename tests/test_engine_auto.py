"""`engine=auto`: the documented rule of `fastrl_core.engines.resolve.choose_engine`, and the config check that
resolves it once, naming the choice in one line."""

import pytest

import fastrl_core.engines.resolve as resolve
from fastrl_core.engines.resolve import choose_engine
from fastrl_core.named_models import model_config_value
from fastrl_core.run_config import load_config


def test_the_sketch_a_pruner_reads_decides_first():
    assert choose_engine("cuda", "lm_head", "fastrl", vllm_importable=True)[0] == "hf"  # hidden states
    assert choose_engine("cpu", "logprob", "fastrl", vllm_importable=True)[0] == "vllm"  # top-K log-probs
    assert choose_engine("cuda", "lm_head", "none", vllm_importable=True)[0] == "vllm"  # GRPO reads no sketch
    assert choose_engine("cuda", "auto", "fastrl", vllm_importable=True)[0] == "vllm"  # both give sketch=auto
    assert choose_engine("cpu", "auto", "fastrl", vllm_importable=True, hidden_size=128, vocab_size=482)[0] == "hf"
    assert choose_engine("cpu", "auto", "fastrl", vllm_importable=True, hidden_size=512, vocab_size=482)[0] == "vllm"


def test_without_vllm_hf_and_on_a_gpu_vllm():
    engine, reason = choose_engine("cuda", "tokens", "fastrl", vllm_importable=False)
    assert (engine, reason) == ("hf", "vllm does not import here")
    assert choose_engine("cuda", "tokens", "fastrl", vllm_importable=True)[0] == "vllm"


def test_on_cpu_vllm_only_from_the_measured_width_and_vocabulary(monkeypatch):
    monkeypatch.setattr(resolve, "CPU_VLLM_MIN_HIDDEN", None)
    assert choose_engine("cpu", "tokens", "none", vllm_importable=True, hidden_size=4096, vocab_size=1024)[0] == "hf"
    monkeypatch.setattr(resolve, "CPU_VLLM_MIN_HIDDEN", 1024)
    assert choose_engine("cpu", "tokens", "none", vllm_importable=True, hidden_size=1024, vocab_size=1024)[0] == "vllm"
    engine, reason = choose_engine("cpu", "tokens", "none", vllm_importable=True, hidden_size=512, vocab_size=1024)
    assert engine == "hf" and "hidden size 512 < 1024" in reason
    engine, reason = choose_engine("cpu", "tokens", "none", vllm_importable=True, hidden_size=2048,
                                   vocab_size=151_936)  # Qwen's vocabulary: vLLM-CPU was slower there
    assert engine == "hf" and "vocabulary 151936" in reason
    assert choose_engine("cpu", "tokens", "none", vllm_importable=True, hidden_size=2048)[0] == "hf"  # unknown vocab
    assert choose_engine("cpu", "tokens", "none", vllm_importable=True, hidden_size=None)[0] == "hf"


def test_hidden_size_is_read_from_the_checkpoint_config_without_weights(tmp_path):
    assert model_config_value("embedded") == 128
    assert model_config_value("embedded", "vocab_size") == 482
    (tmp_path / "config.json").write_text('{"text_config": {"hidden_size": 2048}}')
    assert model_config_value(str(tmp_path)) == 2048
    assert model_config_value("Qwen/Qwen2.5-VL-3B-Instruct") is None  # a hub name: nothing downloaded


def test_the_config_check_resolves_auto_once_and_says_so(capsys):
    config = load_config("embedded", ["engine=auto"])  # sketch=auto: the width decides
    assert (config.engine, config.sketch) == ("hf", "lm_head")
    assert capsys.readouterr().err.strip().splitlines() == [
        "engine=auto -> hf: on cpu the HF engine is faster at this size (hidden size 128 < 512; engines.resolve)"]
    assert load_config("embedded", ["engine=auto", "sketch=lm_head"]).engine == "hf"  # fastrl reads lm_head: hf
    assert capsys.readouterr().err.strip().splitlines() == [
        "engine=auto -> hf: pruner 'fastrl' reads sketch='lm_head', which vLLM cannot give (it returns no hidden "
        "states)"]
    assert load_config("embedded", ["engine=hf"]).engine == "hf"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("value", ["vllm", "auto"])
def test_vllm_and_auto_are_valid_on_cpu(value):
    config = load_config("embedded", [f"engine={value}", "sketch=logprob", "sketch_top_k=20"])
    assert config.engine == "vllm"
