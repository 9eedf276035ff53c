"""Install fastrl_torchvision_shim.py into this interpreter's site-packages with a .pth file that imports it at
start-up (in every process, vLLM's model-inspection subprocess included); run by `make setup`. Idempotent."""

import shutil
import sysconfig
from pathlib import Path

SHIM = Path(__file__).resolve().parent / "fastrl_torchvision_shim.py"

if __name__ == "__main__":
    site = Path(sysconfig.get_path("purelib"))
    shutil.copyfile(SHIM, site / SHIM.name)
    (site / "fastrl_torchvision_shim.pth").write_text(f"import {SHIM.stem}\n")
    print(f"installed {SHIM.name} and its .pth in {site}")
