"""Problems, prompt templates and the synthetic geometry task.

- `problems`: the `Problem` type and `load_problems` for every source (folder layout, HF schemas, hub names).
- `synthetic`: the embedded synthetic diagram task, written in the same folder layout.
- `templates`: prompt templates ("math", "r1v", "short") and the answer style each expects.
"""
