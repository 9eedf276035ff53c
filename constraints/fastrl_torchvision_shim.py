"""Makes PyPI's torchvision importable beside a CPU build of torch (installed by `make setup` with a .pth file).

PyPI's Linux torchvision wheels are CUDA builds: beside `torch==2.13.0+cpu` their native library does not load, and
`import torchvision` then fails with "operator torchvision::nms does not exist" (its Python side registers fake
kernels for ops the native library would have defined). vLLM's Qwen2-VL model module imports torchvision, and vLLM
inspects the model in a subprocess, so the fix must act in every process of the environment: the .pth line imports
this module, which waits (a `sys.meta_path` hook, torch not imported) until something imports torchvision, then
defines the two op schemas torchvision's Python side needs. Nothing else of torchvision's native code is provided:
calling `torchvision.ops.nms` raises; FastRL and vLLM's Qwen2.5-VL path never call it (docs/notes.md §8).

Acts only where it is needed: torch without CUDA and a torchvision whose version has no `+cpu` tag.
"""

import importlib.abc
import importlib.metadata
import sys

OP_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_library = None  # the torch.library.Library holding the schemas (kept alive: dropping it unregisters them)


def _needs_schemas(torch) -> bool:
    try:
        torchvision_version = importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        return False
    return torch.version.cuda is None and "+cpu" not in torchvision_version


def define_op_schemas() -> None:
    """Define torchvision::nms and ::qnms (schemas only) when this torch/torchvision pair needs them; idempotent."""
    global _library
    import torch

    if _library is not None or not _needs_schemas(torch):
        return
    library = torch.library.Library("torchvision", "DEF")
    for schema in OP_SCHEMAS:
        library.define(schema)
    _library = library


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs `define_op_schemas` once, just before the first `import torchvision`; finds nothing itself."""

    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            sys.meta_path.remove(self)
            define_op_schemas()
        return None


if not any(isinstance(finder, _BeforeTorchvision) for finder in sys.meta_path):
    sys.meta_path.insert(0, _BeforeTorchvision())
