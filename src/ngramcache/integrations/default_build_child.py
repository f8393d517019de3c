"""The child process of ``default_build.plain_runs``: plain decoding on the llama-cpp-python build
first on ``PYTHONPATH`` (a module of its own: it loads models through ``integrations.llama``,
which itself looks for that build).

    python -m ngramcache.integrations.default_build_child MODEL N THREADS RUNS < prompt

prints one JSON object with each run's figures.
"""

from __future__ import annotations

import json
import os
import sys


def _child(argv: list[str]) -> int:
    import llama_cpp

    import ngramcache.integrations.llama as nl

    model, n_tokens, threads, runs = argv[0], int(argv[1]), int(argv[2]) or None, int(argv[3])
    prompt = sys.stdin.buffer.read()
    llm = nl.make_llama(model, n_ctx=4096, n_threads=threads, exact=False)
    nl.generate(llm, prompt[:200] or prompt, None, 4)  # first touches of the weights are page faults
    out = []
    for _ in range(runs):
        r = nl.generate(llm, prompt, None, n_tokens)
        out.append({"tokens": r.tokens.tolist(), "gen_tok_s": r.gen_tokens_per_s, "e2e_tok_s": r.e2e_tokens_per_s,
                    "t_prompt": r.t_prompt})
    info = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
    print(json.dumps({"runs": out, "llama_cpp": os.path.dirname(llama_cpp.__file__), "system_info": info}))
    llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
