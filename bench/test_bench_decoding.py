"""Paired benchmarks of whole generations: the default drafter (adaptive gate on the model's
measured verification costs) beside plain greedy decoding, on the packaged SmolLM2, in the
same run. Two workloads: fresh text (a chat turn that asks for new code: nothing to copy,
where drafting must cost next to nothing) and an edit of given code (mostly copied, where it
must win). The drafted output must equal plain's token for token (an exact build).

    .venv/bin/python -m pytest bench/test_bench_decoding.py --benchmark-only
    .venv/bin/python -m pytest bench/test_bench_decoding.py --benchmark-compare   # a regression shows

The plain and drafter benchmarks run one after the other, and a machine's speed drifts between
them; the drafter's benchmark also runs a plain generation before each of its rounds and
reports plain / drafter round by round (``extra_info['interleaved']``, and a line at the end).
"""

from __future__ import annotations

import pytest

from pairs import baseline_side, interleave, ngramcache_side

N_TOKENS = 96
ROUNDS = 5

FRESH = ("<|im_start|>user\nWrite a Python function that parses a date in the form YYYY-MM-DD and "
         "returns the day of the week as a word. Give only the code.<|im_end|>\n<|im_start|>assistant\n")


def _edit_prompt() -> str:
    from ngramcache.data import demo_task

    return demo_task().prompt


WORKLOADS = {"fresh text": lambda: FRESH, "edit code": _edit_prompt}


@pytest.fixture(scope="module")
def llm():
    nl = pytest.importorskip("ngramcache.integrations.llama")
    from ngramcache.models import model_path

    try:
        path = model_path("smollm2")
    except (FileNotFoundError, LookupError) as e:
        pytest.skip(str(e))
    return nl.make_llama(path, n_ctx=2048, n_batch=512)


@pytest.fixture(scope="module")
def plain_outputs(llm):
    import ngramcache.integrations.llama as nl

    return {name: nl.generate(llm, make(), None, N_TOKENS).tokens.tolist() for name, make in WORKLOADS.items()}


def _group(name: str) -> str:
    return f"generate: smollm2, {name}, {N_TOKENS} tokens"


@pytest.mark.model
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_plain(benchmark, llm, plain_outputs, workload):
    import ngramcache.integrations.llama as nl

    baseline_side(benchmark, _group(workload), "plain decoding")
    prompt = WORKLOADS[workload]()
    r = benchmark.pedantic(nl.generate, args=(llm, prompt, None, N_TOKENS), rounds=ROUNDS, warmup_rounds=1)
    assert r.tokens.tolist() == plain_outputs[workload]


@pytest.mark.model
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_default_drafter(benchmark, llm, plain_outputs, workload):
    import ngramcache.integrations.llama as nl

    ngramcache_side(benchmark, _group(workload), "default drafter")
    prompt = WORKLOADS[workload]()

    def run():
        # a new drafter per generation, as a first request meets it (its gate starts from its priors)
        return nl.generate(llm, prompt, nl.adaptive_drafter(llm), N_TOKENS)

    # plain decoding before every round as well: the ratio of neighbours, not of two runs apart
    setup, finish = interleave(benchmark, "plain decoding", lambda: nl.generate(llm, prompt, None, N_TOKENS))
    r = benchmark.pedantic(run, setup=setup, rounds=ROUNDS, warmup_rounds=1)
    finish()
    assert r.tokens.tolist() == plain_outputs[workload]
    if workload == "edit code":
        assert r.accepted > N_TOKENS // 4
