"""Every engine class implements `engines.base.Engine`: the four methods exist (runtime_checkable) and their
parameters match the protocol's by name and kind. VLLMEngine is checked as a class: vLLM cannot run on CPU."""

import inspect

import pytest

from fastrl_core.engines.base import Engine
from fastrl_core.engines.hf import HFEngine
from fastrl_core.engines.vllm import VLLMEngine

METHODS = ("generate", "token_logprobs", "greedy", "sync_weights")


def signature_mismatches(engine_class: type) -> list[str]:
    """Protocol methods `engine_class` lacks or whose parameters (names and kinds, defaults aside) differ."""
    problems = []
    for name in METHODS:
        method = getattr(engine_class, name, None)
        if method is None:
            problems.append(f"{name}: missing")
            continue
        want = [(p.name, p.kind) for p in inspect.signature(getattr(Engine, name)).parameters.values()]
        have = [(p.name, p.kind) for p in inspect.signature(method).parameters.values()]
        if want != have:
            problems.append(f"{name}: {have} != {want}")
    return problems


@pytest.mark.parametrize("engine_class", [HFEngine, VLLMEngine])
def test_each_engine_class_implements_the_protocol(engine_class):
    assert issubclass(engine_class, Engine)
    assert signature_mismatches(engine_class) == []


def test_the_check_rejects_a_missing_method_and_a_wrong_signature():
    class NoSync:
        def generate(self, problems, rollouts_per_prompt, *, generator=None): ...
        def token_logprobs(self, model, problems, rollouts, index): ...
        def greedy(self, problems, *, batch_size=64): ...

    class PositionalGenerator(NoSync):
        def generate(self, problems, rollouts_per_prompt, generator=None): ...
        def sync_weights(self, model): ...

    assert not issubclass(NoSync, Engine)
    assert signature_mismatches(NoSync) == ["sync_weights: missing"]
    assert issubclass(PositionalGenerator, Engine)  # runtime_checkable sees names only
    assert [m.split(":")[0] for m in signature_mismatches(PositionalGenerator)] == ["generate"]
