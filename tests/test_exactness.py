"""Speculative output equals plain greedy decoding, token for token, asserted with ``==``.

On a model whose batched logits equal its single-token logits bit for bit (llama.cpp built
with -DGGML_LLAMAFILE=OFF, weights not repacked, GGML_CPU_TILED_MM=0: what ``make_llama``
loads), no drafter can change greedy output: every verified row is the row plain decoding
computes. These tests check that on the packaged models for every drafter of the catalog on
32 prompts, through ngramcache's loop, llama-cpp-python's own loop with ``LlamaDrafter``,
and a prompt decoded in two pieces; then the switches themselves (``no_weight_repacking``,
``GGML_CPU_TILED_MM``), the stored answers of ``check_exact`` and the ``check-exact`` command.

The prompts were written for these tests (no file of this machine is read): code edits,
summaries, quotes from a document (RAG), chat turns and open-ended requests, short and long.
Many invite copying, so that drafts are proposed, accepted and rejected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import ngramcache.integrations.llama as nl
from conftest import ROOT, run_cli
from ngramcache.decoding.loop import PromptCache
from ngramcache.drafters.catalog import DRAFTERS, make_drafter
from ngramcache.integrations import exactness
from ngramcache.models import default_model_path


_MERGE = '''def merge_intervals(intervals):
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = []
    for start, end in ordered:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
'''

_CSV = '''def read_scores(path, column="score"):
    rows = []
    with open(path) as handle:
        header = handle.readline().strip().split(",")
        index = header.index(column)
        for line in handle:
            fields = line.strip().split(",")
            if len(fields) != len(header):
                continue
            rows.append(float(fields[index]))
    return rows
'''

_CLASS = '''class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, key, amount=1):
        self.counts[key] = self.counts.get(key, 0) + amount

    def most_common(self, n):
        pairs = sorted(self.counts.items(), key=lambda kv: kv[1], reverse=True)
        return pairs[:n]
'''

_JS = '''function debounce(fn, wait) {
  let timer = null;
  return function (...args) {
    clearTimeout(timer);
    timer = setTimeout(() => fn.apply(this, args), wait);
  };
}
'''

_SQL = '''SELECT customers.name, COUNT(orders.id) AS order_count
FROM customers
LEFT JOIN orders ON orders.customer_id = customers.id
WHERE customers.created_at >= '2024-01-01'
GROUP BY customers.name
ORDER BY order_count DESC;
'''

_REPORT = (
    "The library's reading room reopened in March after a winter of repairs. The roof over the "
    "east wing was replaced, the heating now runs on a heat pump, and the old card catalogue was "
    "moved to the basement, where it can still be consulted on request. Visitors in the first month "
    "numbered 2,340, about a tenth more than in the same month last year. The most borrowed books "
    "were local histories and guides to the coastal path. Staff noted that the new opening hours, "
    "nine to seven on weekdays, suit students better, but several older readers asked for the "
    "Saturday afternoon session to return. The board will decide in June whether to fund it.")

_POLICY = (
    "Section 4. Returns. Goods may be returned within 30 days of delivery if they are unused and in "
    "their original packaging. Refunds are paid to the original means of payment within 14 days of "
    "receiving the goods. Section 5. Damaged goods. If an item arrives damaged, the customer must "
    "report it within 7 days, with a photograph, and the company will collect it at its own cost. "
    "Section 6. Exclusions. Made-to-measure items, opened software and perishable food cannot be "
    "returned unless they are faulty.")

_MEETING = (
    "Minutes of the garden committee, 12 May. Present: Ana, Ben, Chloe, David. The water butts "
    "are full after the April rain. Ben will fix the broken gate by the end of the month. Chloe "
    "proposed a seed swap on the first Sunday of June; agreed. The compost bins need turning every "
    "two weeks and David will draw up a rota. Next meeting: 9 June, 7 pm, in the shed.")

_STORY = (
    "The ferry left at six. Mara stood at the rail with her brother's old camera, the one with the "
    "cracked lens, and photographed the gulls that followed the wake. By the time the island rose "
    "out of the haze she had used the whole film. Her brother had promised to meet her at the "
    "harbour, but the quay was empty except for a dog asleep on a coil of rope.")


def _chat(turns: list[tuple[str, str]], last: str) -> str:
    body = "".join(f"<|user|>\n{u}\n<|assistant|>\n{a}\n" for u, a in turns)
    return body + f"<|user|>\n{last}\n<|assistant|>\n"


PROMPTS: list[str] = [
    # code edits
    f"Add type hints to this function and keep everything else the same.\n\n```python\n{_MERGE}```\n\n```python\n",
    f"Rename the variable `ordered` to `by_start`.\n\n```python\n{_MERGE}```\n\nRenamed:\n\n```python\n",
    f"Add a docstring to this function.\n\n```python\n{_CSV}```\n\n```python\n",
    f"Rewrite this function to skip empty lines.\n\n```python\n{_CSV}```\n\nRewritten:\n\n```python\n",
    f"Add a method `total` that returns the sum of all counts.\n\n```python\n{_CLASS}```\n\n```python\n",
    f"Convert this JavaScript to TypeScript.\n\n```js\n{_JS}```\n\n```ts\n",
    f"Format this SQL query with lowercase keywords.\n\n```sql\n{_SQL}```\n\n```sql\n",
    f"Copy this code exactly.\n\n```python\n{_CLASS}```\n\nCopy:\n\n```python\n",
    f"Find the bug in this function, then show the fixed version.\n\n```python\n{_CSV}```\n\nThe bug:",
    # summaries
    f"{_REPORT}\n\nSummarise the text above in two sentences.\n\nSummary:",
    f"{_MEETING}\n\nList the action points from these minutes, one per line.\n\n-",
    f"{_POLICY}\n\nSummarise the returns policy for a customer.\n\n",
    f"{_STORY}\n\nRetell this passage in the first person.\n\n",
    f"{_REPORT}\n\n{_MEETING}\n\nWrite a one-line headline for each of the two texts above.\n\n1.",
    # quotes from a document (RAG)
    f"Document:\n{_POLICY}\n\nQuestion: How long does a customer have to report damaged goods? Quote the "
    "sentence that says so.\n\nAnswer: \"",
    f"Document:\n{_REPORT}\n\nQuestion: How many visitors came in the first month? Answer by quoting the "
    "document word for word.\n\nAnswer:",
    f"Context:\n{_MEETING}\n\nWhat will Ben do? Quote the minutes.\n\n",
    f"Context:\n{_POLICY}\n\nWhich items cannot be returned? Copy the relevant section.\n\nSection",
    f"Source text:\n{_STORY}\n\nQuote the sentence that describes the camera.\n\n\"",
    # chat turns
    _chat([("What is the capital of Portugal?", "The capital of Portugal is Lisbon.")],
          "And what river runs through it?"),
    _chat([("Give me a word that rhymes with light.", "Bright."), ("Another one?", "Night.")],
          "Now use both in one sentence."),
    _chat([("Here is my function:\n" + _MERGE, "Thanks, it merges overlapping intervals.")],
          "Can you show it again with comments?"),
    _chat([], "Explain in one paragraph why the sky is blue."),
    _chat([("I have eggs, flour and milk.", "You could make pancakes.")], "How? Give me the steps."),
    # open-ended
    "Write a short poem about a lighthouse in winter.\n\n",
    "List five uses for a paperclip:\n1.",
    "Once upon a time, in a village at the edge of a forest,",
    "The three most important things to check before a long bicycle ride are",
    # short
    "The capital of France is",
    "1, 2, 3, 4, 5,",
    "def fibonacci(n):",
    # long: several documents and a request that quotes from all of them
    f"{_REPORT}\n\n{_POLICY}\n\n{_MEETING}\n\n{_STORY}\n\n```python\n{_MERGE}```\n\nFor each of the five "
    "texts above, quote its first sentence exactly.\n\n1.",
]


# ---------------------------------------------------------------------------------------------
# the packaged models, loaded once each for the module

MODELS = ("gemma", "smollm2")
N = 16  # tokens per output: enough for several verify steps, short enough for 32 x 9 runs
N_DRAFT = 8
# ngram-mod's own defaults draft 48-64 tokens at once, never within N_DRAFT
OPTIONS = {"mod": {"n_match": 4, "n_min": 2, "n_max": N_DRAFT}}


def _model_path(name: str) -> str:
    pytest.importorskip("llama_cpp")
    try:
        return default_model_path(name)
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module", params=MODELS)
def exact_llm(request):
    llm = nl.make_llama(_model_path(request.param), n_ctx=2048, n_batch=256)
    yield SimpleNamespace(name=request.param, llm=llm, path=_model_path(request.param))
    llm.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One exactness store for the module: the check measured once is read by the command."""
    return str(tmp_path_factory.mktemp("exactness") / "exactness.json")


def _top2_gap(row: np.ndarray) -> float:
    top2 = np.partition(row, -2)[-2:]
    return float(top2[1] - top2[0])


@pytest.fixture(scope="module")
def runs(exact_llm):
    """For every prompt: plain greedy (with plain's top-2 logit gaps), then every drafter of
    the catalog, all on one PromptCache so that the prompt is decoded once per prompt."""
    out = {"plain": [], "gaps": [], **{name: [] for name in DRAFTERS}}
    for prompt in PROMPTS:
        cache = PromptCache()
        gaps = {}
        out["plain"].append(nl.generate(exact_llm.llm, prompt, None, N, prompt_cache=cache,
                                        on_logits=lambda i, row: gaps.__setitem__(i, _top2_gap(row))))
        out["gaps"].append(gaps)
        for name in DRAFTERS:
            drafter = make_drafter(name, n_draft=N_DRAFT, **OPTIONS.get(name, {}))
            out[name].append(nl.generate(exact_llm.llm, prompt, drafter, N, prompt_cache=cache))
    return out


# ---------------------------------------------------------------------------------------------
# every path identical on an exact model

@pytest.mark.model
def test_packaged_model_is_exact(exact_llm, store):
    report = exactness.check_exact(exact_llm.llm, path=store)
    assert not report.cached
    assert (report.rows, report.rows_equal) == (48, 48)
    assert report.max_abs_diff == 0.0 and report.first_argmax_flip is None
    assert report.exact and report.causes == []
    settings = (report.weight_repacking, report.tiled_mm, report.llamafile, report.flash_attn)
    assert settings == (False, "off", False, False)
    again = exactness.check_exact(exact_llm.llm, path=store)
    assert again.cached and again.as_dict() | {"cached": False} == report.as_dict()


@pytest.mark.model
def test_enough_prompts_and_real_outputs(runs):
    assert len(PROMPTS) >= 30
    assert all(r.n_tokens == N or r.stop_reason == "eos" for r in runs["plain"])
    assert len(set(PROMPTS)) == len(PROMPTS)
    # every prompt gets its own answer, but for one pair Gemma opens alike within N tokens
    assert len({tuple(r.tokens.tolist()) for r in runs["plain"]}) >= len(PROMPTS) - 1


@pytest.mark.model
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_every_drafter_equals_plain(runs, name):
    differ = []
    for i, (plain, gaps, r) in enumerate(zip(runs["plain"], runs["gaps"], runs[name])):
        if r.tokens.tolist() != plain.tokens.tolist():
            at = next((j for j, (a, b) in enumerate(zip(plain.tokens, r.tokens)) if a != b), None)
            differ.append(f"prompt {i}: from token {at} (plain's top-2 gap there {gaps.get(at, float('nan')):.4f})")
    assert differ == [], f"{name} changed greedy output: {differ}"
    drafted = sum(r.drafted for r in runs[name])
    accepted = sum(r.accepted for r in runs[name])
    assert drafted > 0, f"{name} never drafted: nothing was verified in a batch"
    assert [r.text for r in runs[name]] == [p.text for p in runs["plain"]]
    print(f"\n{name}: {drafted} drafted, {accepted} accepted on {len(PROMPTS)} prompts")


@pytest.mark.model
def test_drafts_were_rejected_and_rolled_back(runs):
    # identity after rejections is the point: a rejected draft leaves rows in the KV cache
    # that must be removed, and the next batch starts after them
    rejected = sum(1 for name in DRAFTERS for r in runs[name] for a in r.accept_lengths if a < N_DRAFT)
    accepted = sum(r.accepted for name in DRAFTERS for r in runs[name])
    assert rejected > 50 and accepted > 100


@pytest.mark.model
def test_llama_cpp_python_loop_with_llama_drafter_equals_plain(exact_llm, runs):
    # counted: llama-cpp-python's loop does not tell a draft model what it accepted
    drafter = nl.CountingDraftModel(nl.LlamaDrafter(make_drafter("copy", n_draft=N_DRAFT)))
    llm = nl.make_llama(exact_llm.path, drafter=drafter, n_ctx=2048, n_batch=256)
    # llama-cpp-python's loop decodes its prompts itself, through the exact kernels: where
    # ngramcache's loop takes prompts through a repacked copy, the plain decoding to equal is
    # that loop's own, without a draft model
    own = getattr(exact_llm.llm, "_ngramcache_prompt_layout", None) is not None
    plain_llm = nl.make_llama(exact_llm.path, n_ctx=2048, n_batch=256) if own else None
    try:
        accepted = 0
        for i in range(0, len(PROMPTS), 3):
            r = nl.generate_llama_cpp(llm, PROMPTS[i], N)
            want = nl.generate_llama_cpp(plain_llm, PROMPTS[i], N) if own else runs["plain"][i]
            assert r.tokens.tolist() == want.tokens.tolist(), f"prompt {i}"
            accepted += r.accepted
        assert accepted > 0  # drafts were verified in batches and kept
        out = llm.create_completion(PROMPTS[1], max_tokens=N, temperature=0.0, repeat_penalty=1.0)
        want = nl.generate_llama_cpp(plain_llm, PROMPTS[1], N).text if own else runs["plain"][1].text
        assert out["choices"][0]["text"] == want
    finally:
        llm.close()
        if plain_llm is not None:
            plain_llm.close()


@pytest.mark.model
def test_prompt_in_two_pieces_equals_one(exact_llm):
    # with one layout (prompts through the exact kernels too), a prompt's KV cache is the same
    # bits whichever pieces it was decoded in; with a repacked copy for prompts it is not
    # (docs/exactness.md), and tests/test_llama_prompt.py pins what holds there
    if getattr(exact_llm.llm, "_ngramcache_prompt_layout", None) is not None:
        llm = nl.make_llama(exact_llm.path, n_ctx=2048, n_batch=256, prompt_layout=False)
        try:
            _two_pieces_equal_one(SimpleNamespace(llm=llm))
        finally:
            llm.close()
    else:
        _two_pieces_equal_one(exact_llm)


def _two_pieces_equal_one(exact_llm):
    backend = nl.LlamaBackend.of(exact_llm.llm)
    tokens = backend.tokenize(PROMPTS[-1])
    half = tokens.size // 2
    rows = {}

    def keep(key):
        return lambda i, row: rows.setdefault((key, i), row.copy())

    one = nl.generate(exact_llm.llm, tokens, None, N, on_logits=keep("one"))
    cache = PromptCache()
    nl.generate(exact_llm.llm, tokens[:half], None, 4, prompt_cache=cache)
    assert cache.reusable(backend, tokens) >= half  # the second call decodes only the rest
    two = nl.generate(exact_llm.llm, tokens, None, N, prompt_cache=cache, on_logits=keep("two"))
    assert two.tokens.tolist() == one.tokens.tolist()
    assert all(np.array_equal(rows[("one", i)].view(np.uint32), rows[("two", i)].view(np.uint32)) for i in range(N))
    nl.generate(exact_llm.llm, tokens[:half], None, 4, prompt_cache=cache)
    drafted = nl.generate(exact_llm.llm, tokens, make_drafter("copy", n_draft=N_DRAFT), N, prompt_cache=cache)
    assert drafted.tokens.tolist() == one.tokens.tolist()


# ---------------------------------------------------------------------------------------------
# the switches

@pytest.mark.model
def test_no_weight_repacking_sets_the_parameter_only_inside(exact_llm):
    import llama_cpp
    import llama_cpp.llama_cpp as low

    before = low.llama_model_default_params
    with exactness.no_weight_repacking():
        inside = llama_cpp.Llama(model_path=exact_llm.path, vocab_only=True, verbose=False)
    outside = llama_cpp.Llama(model_path=exact_llm.path, vocab_only=True, verbose=False)
    try:
        assert not inside.model_params.use_extra_bufts and not exactness.weight_repacking(inside)
        assert outside.model_params.use_extra_bufts and exactness.weight_repacking(outside)
        assert low.llama_model_default_params is before
        with pytest.raises(RuntimeError, match="boom"), exactness.no_weight_repacking():
            raise RuntimeError("boom")
        assert low.llama_model_default_params is before
        assert not exactness.weight_repacking(exact_llm.llm)  # make_llama loaded it so
    finally:
        inside.close()
        outside.close()


def _child(code: str, env_tiled: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != exactness.TILED_MM_ENV}
    if env_tiled is not None:
        env[exactness.TILED_MM_ENV] = env_tiled
    proc = subprocess.run([sys.executable, "-W", "always", "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split() + (["WARNED"] if "ExactnessWarning" in proc.stderr else [])


@pytest.mark.model
def test_tiled_matmul_switched_off_before_the_first_model(exact_llm):
    code = f"""
        import os
        import ngramcache.integrations.llama as nl
        from ngramcache.integrations import exactness
        assert os.environ.get("GGML_CPU_TILED_MM") is None
        llm = nl.make_llama({exact_llm.path!r}, n_ctx=256)
        print(os.environ["GGML_CPU_TILED_MM"], exactness.exact_kernels())
        """
    assert _child(code, None) == ["0", "off"]


@pytest.mark.model
def test_tiled_matmul_set_too_late_is_said(exact_llm):
    code = f"""
        import os, llama_cpp
        llama_cpp.Llama(model_path={exact_llm.path!r}, vocab_only=True, verbose=False)
        from ngramcache.integrations import exactness
        print(exactness.exact_kernels(), os.environ["GGML_CPU_TILED_MM"])
        """
    assert _child(code, None) == ["unsure", "0", "WARNED"]


@pytest.mark.model
def test_tiled_matmul_asked_for_is_respected_and_reported(exact_llm, tmp_path):
    code = f"""
        import ngramcache.integrations.llama as nl
        from ngramcache.integrations import exactness
        llm = nl.make_llama({exact_llm.path!r}, n_ctx=256)
        status = exactness.exactness_status(llm, path={str(tmp_path / "none.json")!r})
        print(exactness.exact_kernels(), status["exact"], status["measured"],
              "GGML_CPU_TILED_MM" in status["causes"][0])
        """
    assert _child(code, "1") == ["on", "False", "False", "True"]


# ---------------------------------------------------------------------------------------------
# the stored answers

def _canned(llm, rows_equal=48) -> exactness.ExactnessReport:
    return exactness.ExactnessReport(model=llm.model_path, rows=48, rows_equal=rows_equal, max_abs_diff=0.0,
                                     first_argmax_flip=None, chunk=8, n_threads=1, n_threads_batch=1,
                                     weight_repacking=False, tiled_mm="off", llamafile=False, flash_attn=False,
                                     seconds=1.0)


@pytest.mark.model
def test_answers_are_kept_per_model_build_and_threads(exact_llm, tmp_path, monkeypatch):
    import llama_cpp

    llm, path = exact_llm.llm, str(tmp_path / "sub" / "exactness.json")
    calls = []
    monkeypatch.setattr(exactness, "measure_exactness", lambda m: calls.append(m) or _canned(m))
    first = exactness.check_exact(llm, path=path)
    assert not first.cached and len(calls) == 1
    assert exactness.check_exact(llm, path=path).cached and len(calls) == 1
    assert not exactness.check_exact(llm, path=path, refresh=True).cached and len(calls) == 2
    assert exactness.exactness_status(llm, path=path) == {"exact": True, "measured": True, "rows_equal": 48,
                                                          "rows": 48, "causes": []}
    ctx = llm._ctx.ctx
    threads = (llama_cpp.llama_n_threads(ctx), llama_cpp.llama_n_threads_batch(ctx))
    llama_cpp.llama_set_n_threads(ctx, threads[0] + 1, threads[1] + 1)
    try:
        assert not exactness.check_exact(llm, path=path).cached and len(calls) == 3
    finally:
        llama_cpp.llama_set_n_threads(ctx, *threads)
    # a damaged store, or an entry that is not a report, is measured again and replaced
    for damaged in ("not json", "[1, 2]", '{"%s": {"rows": 3}}' % exactness._store_key(llm, "off")):
        with open(path, "w") as f:
            f.write(damaged)
        assert not exactness.check_exact(llm, path=path).cached
        assert exactness.check_exact(llm, path=path).cached
    assert len(calls) == 6


@pytest.mark.model
def test_status_without_a_measurement_runs_nothing(exact_llm, tmp_path, monkeypatch):
    monkeypatch.setattr(exactness, "measure_exactness", lambda m: pytest.fail("measured"))
    status = exactness.exactness_status(exact_llm.llm, path=str(tmp_path / "empty.json"))
    assert status == {"exact": None, "measured": False, "rows_equal": None, "rows": None, "causes": []}
    assert exactness.exactness_status(object()) is None


# ---------------------------------------------------------------------------------------------
# the command

@pytest.mark.model
def test_check_exact_command_reads_the_stored_answer(exact_llm, store, capsys, monkeypatch):
    monkeypatch.setenv("NGRAMCACHE_CACHE_DIR", os.path.dirname(store))
    exactness.check_exact(exact_llm.llm, path=store)  # measured by test_packaged_model_is_exact, or now
    rc, out, err = run_cli(capsys, "check-exact", "-m", exact_llm.name)
    assert rc == 0, err
    lines = dict(line.strip().split("  ", 1) for line in out.splitlines())
    assert lines["rows equal"].strip().startswith("48/48")
    assert lines["verdict"].strip() == "exact" and lines["max |diff|"].strip() == "0"
    assert lines["measured"].strip() == "earlier (stored answer)"
    # what make_llama loaded: a repacked copy for prompts where it pays (none for these two on x86-64)
    repacked = getattr(exact_llm.llm, "_ngramcache_prompt_layout", None) is not None
    assert lines["configuration"].strip().startswith("tokens and drafts: no llamafile kernels")
    assert ("prompts through a repacked copy" in lines["configuration"]) == repacked
    rc, out, err = run_cli(capsys, "check-exact", "-m", exact_llm.name, "--json", "-q")
    assert rc == 0 and err == ""
    got = json.loads(out)
    assert (got["exact"], got["rows_equal"], got["cached"], got["causes"]) == (True, 48, True, [])


def test_check_exact_command_says_why_not(capsys, monkeypatch, tmp_path):
    closed = []
    fake_llm = SimpleNamespace(close=lambda: closed.append(True))
    report = exactness.ExactnessReport(model=str(tmp_path / "m.gguf"), rows=48, rows_equal=3, max_abs_diff=1.31,
                                       first_argmax_flip=17, chunk=8, n_threads=2, n_threads_batch=2,
                                       weight_repacking=True, tiled_mm="on", llamafile=True, flash_attn=False,
                                       seconds=4.2)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(nl, "make_llama", lambda *a, **k: fake_llm)
    monkeypatch.setattr(exactness, "check_exact", lambda llm, refresh=False: report)
    rc, out, err = run_cli(capsys, "check-exact", "-m", tmp_path / "m.gguf", "-q")
    assert rc == 1 and closed == [True]
    assert "rows equal         3/48" in out and "first argmax flip  row 17" in out
    assert "verdict            not exact" in out
    assert "configuration      tokens and drafts: " in out and "weights repacked" in out
    why = [line for line in out.splitlines() if line.startswith("  why: ")]
    assert len(why) == 3 and "GGML_LLAMAFILE=OFF" in why[0] and "repacking" in why[1] and "GGML_CPU_TILED_MM" in why[2]
    assert err == ("ngramcache check-exact: error: m.gguf is not exact here: drafting can change greedy output "
                   "after a near tie\n")
    rc, out, err = run_cli(capsys, "check-exact", "-m", tmp_path / "m.gguf", "--json", "-q")
    assert rc == 1 and json.loads(out)["verdict"] == "not exact" and len(json.loads(out)["causes"]) == 3


def test_check_exact_command_bad_arguments(capsys):
    rc, out, err = run_cli(capsys, "check-exact", "-t", "0")
    assert rc == 2 and "-t must be >= 1, got 0" in err


def test_tiled_switch_is_read_as_ggml_reads_it():
    # ggml's atoi: "1x" switches the tiled path on, "x" and "" leave it off
    assert [exactness._atoi(v) for v in ("0", "1", " 1x", "x", "", "-2", "+3", "007")] == [0, 1, 1, 0, 0, -2, 3, 7]


def test_check_exact_needs_a_llama():
    with pytest.raises(TypeError, match="llm must be a llama_cpp.Llama, got object"):
        exactness.check_exact(object())


@pytest.mark.model
def test_flash_attention_is_said_to_break_exactness(exact_llm):
    with pytest.warns(exactness.ExactnessWarning, match="flash_attn=False"):
        llm = nl.make_llama(exact_llm.path, n_ctx=256, flash_attn=True)
    try:
        status = exactness.exactness_status(llm, path=os.devnull)
        assert status["exact"] is False and status["causes"] == [
            "flash attention is on (create the Llama with flash_attn=False)"]
    finally:
        llm.close()


@pytest.mark.model
def test_a_build_with_llamafile_is_said_to_have_no_exact_configuration(monkeypatch):
    # said once per process, at load time, whatever the loading settings
    path = _model_path("smollm2")
    real = exactness.build_info()
    monkeypatch.setattr(exactness, "build_info", lambda: {**real, "llamafile": True})
    monkeypatch.setattr(exactness, "_no_exact_said", False)
    with pytest.warns(exactness.ExactnessWarning, match="no loading setting makes a batch's logits equal"):
        llm = nl.make_llama(path, n_ctx=256)
    llm.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", exactness.ExactnessWarning)
        nl.make_llama(path, n_ctx=256).close()


@pytest.mark.model
def test_configuration_names_the_kernels_and_the_prompt_layout(exact_llm):
    text = exactness.configuration(exact_llm.llm)
    assert "no llamafile kernels" in text and "no repacking" in text and "tiled matmul off" in text
    layout = getattr(exact_llm.llm, "_ngramcache_prompt_layout", None)
    if layout is not None:
        assert f"repacked copy of the weights (+{layout.memory_bytes / 2**20:.0f} MiB)" in text
    else:
        assert "prompts through the same kernels" in text
