"""What a prompt through a repacked copy of the weights saves (make_llama's prompt layout).

    .venv/bin/python bench/bench_prompt_layout.py MODEL [--rounds 6] [--tokens 500]

MODEL: a packaged model's name or a GGUF file (e.g. one made by bench_quant_types.py). One
process loads the model twice, with the second layout (``prompt_layout=True``) and without it,
and alternates a prompt pass of ``--tokens`` tokens of prose between them, ``--rounds`` times;
it prints each pass's milliseconds, the medians and the ratio of each pair, with the share of
the model's matrix weights this CPU repacks.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()

    import ngramcache.llama as nl
    from ngramcache import data
    from ngramcache.integrations.exactness import build_info
    from ngramcache.integrations.llama_prompt import repacked_share
    from ngramcache.models import model_path

    path = model_path(args.model)
    two = nl.make_llama(path, n_ctx=2048, n_threads=args.threads, prompt_layout=True)
    one = nl.make_llama(path, n_ctx=2048, n_threads=args.threads, prompt_layout=False)
    text, _ = data.prose(6000)
    tokens = np.resize(np.asarray(two.tokenize(text.encode()), dtype=np.int32), args.tokens).astype(np.int32)

    def prompt_ms(llm) -> float:
        b = nl.LlamaBackend.of(llm)
        b.clear()
        t = time.perf_counter()
        b.decode(tokens, 0, args.tokens - 1)
        b.logits(args.tokens - 1)
        return (time.perf_counter() - t) * 1e3

    prompt_ms(two), prompt_ms(one)  # warm-up: first matrix products, page faults
    a, c = [], []
    for _ in range(args.rounds):
        a.append(prompt_ms(two))
        c.append(prompt_ms(one))
    share = repacked_share(path, build_info()["system_info"])
    print(f"model {path}: repacked share {share:.2f}, layout memory "
          f"{two._ngramcache_prompt_layout.memory_bytes / 2**20:.0f} MiB")
    print("through a repacked copy, ms:", [round(x) for x in a], "median", round(statistics.median(a)))
    print("one layout, ms:             ", [round(x) for x in c], "median", round(statistics.median(c)))
    print("ratio per pair:", [round(x / y, 2) for x, y in zip(a, c)],
          "median", round(statistics.median(x / y for x, y in zip(a, c)), 2))
    two.close()
    one.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
