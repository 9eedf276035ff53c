"""Memory and time of the scoring pass's head: token log-probs from hidden states at Qwen2.5-VL's vocabulary, dense
(the (M, V) logits, their log-softmax and gradient: the HF engine before `engines.logprobs`) vs chunked (the engine
now), forward + backward of a weighted sum (a loss's shape).

    .venv/bin/python benchmarks/bench_logprob_memory.py                 # M = 512 and 2,048 positions, 2 threads
    .venv/bin/python benchmarks/bench_logprob_memory.py --positions 256 1024 4096 --threads 1

Head: hidden 2048 (Qwen2.5-VL-3B), V = 151,936 rows, float32 (CPU), random values; M positions = rollouts x
completion tokens (2,048 = 16 x 128). Each (variant, M) runs in a FRESH subprocess; after the inputs are built the
process's peak RSS is reset (/proc/self/clear_refs 5, which also resets `ru_maxrss`), so "growth" = peak RSS
during forward + backward − RSS before it. The two variants of one M run back to back, so their time ratio is
measured side by side; timings on a loaded machine are not results, memory hardly depends on load.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench_generate_memory import VOCAB, peak_rss_kib, reset_peak_rss

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

HIDDEN = 2048
MIB = 1 << 20

def one(variant: str, positions: int, threads: int) -> dict:
    """Forward + backward of one variant in this process: growth of peak RSS (MiB) and seconds."""
    import torch

    from fastrl_core.engines.logprobs import chunked_token_logprobs, dense_token_logprobs

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(positions, HIDDEN, generator=g).mul_(0.05).requires_grad_()
    weight = torch.randn(VOCAB, HIDDEN, generator=g).mul_(0.02).requires_grad_()
    targets = torch.randint(0, VOCAB, (positions,), generator=g)
    upstream = torch.randn(positions, generator=g)
    fn = chunked_token_logprobs if variant == "chunked" else dense_token_logprobs
    before = reset_peak_rss()
    start = time.perf_counter()
    (fn(hidden, weight, None, targets) * upstream).sum().backward()
    seconds = time.perf_counter() - start
    peak = peak_rss_kib()
    logits_mib = positions * VOCAB * 4 / MIB
    return {"variant": variant, "positions": positions, "growth_mib": (peak - before) / 1024, "seconds": seconds,
            "logits_mib": logits_mib}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--positions", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", nargs=2, metavar=("VARIANT", "M"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.threads)))
        return []
    rows = []
    for positions in args.positions:
        for variant in ("dense", "chunked"):
            out = subprocess.run([sys.executable, __file__, "--one", variant, str(positions),
                                  "--threads", str(args.threads)], check=True, capture_output=True, text=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"head {HIDDEN} x {VOCAB:,}, float32, {args.threads} threads; growth = peak RSS in forward + backward "
          f"- RSS before; (M, V) float32 logits for scale")
    print(f"{'M':>6} {'logits MiB':>11} {'dense MiB':>10} {'chunked MiB':>12} {'dense s':>8} {'chunked s':>10} "
          f"{'time ratio':>11}")
    for positions in args.positions:
        dense, chunked = (next(r for r in rows if r["positions"] == positions and r["variant"] == v)
                          for v in ("dense", "chunked"))
        print(f"{positions:>6} {dense['logits_mib']:>11.0f} {dense['growth_mib']:>10.0f} "
              f"{chunked['growth_mib']:>12.0f} {dense['seconds']:>8.2f} {chunked['seconds']:>10.2f} "
              f"{chunked['seconds'] / dense['seconds']:>10.2f}x")
    return rows


if __name__ == "__main__":
    main()
