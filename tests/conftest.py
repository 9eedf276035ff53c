import os

import torch

# Two cores here and in CI: more threads than cores is ~2x slower (docs/notes.md §2).
torch.set_num_threads(int(os.environ.get("FASTRL_TEST_THREADS", "2")))
