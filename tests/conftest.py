"""Shared fixtures and helpers: the reference vectors, the pure-Python model's strategies
and comparisons, in-process command-line runs, fake and real models."""

from __future__ import annotations

import atexit
import gzip
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import ngramcache as nc
import reference as ref
from ngramcache import NgramCache
from ngramcache import data
from ngramcache.cli.main import main
from ngramcache.decoding.gate import gated_drafter
from ngramcache.models import default_model_path

ROOT = Path(__file__).resolve().parent.parent

# demo compares with llama-cpp-python's default build where one is found on this machine
# (~/.cache/ngramcache/llama-default): the tests see none unless a test points at one
os.environ["NGRAMCACHE_DEFAULT_BUILD"] = str(ROOT / "build" / "no-default-build")


# --- the reference vectors --------------------------------------------------------------
# The full set (../shared/vectors, see its README) when it is there; otherwise the compact
# copy committed under tests/data (see its README), unpacked to plain files, because the
# core and the command line read them by path. $NGRAMCACHE_VECTORS names the one copy to use,
# with no fallback: NGRAMCACHE_VECTORS=tests/data tests the compact copy even where the full
# set is present.

COMPACT_COPY = ROOT / "tests" / "data"
COMPACT_MANIFEST = "compact.json"


def is_full_set(d: Path) -> bool:
    return (d / "prose.tokens.i32").is_file()


def is_compact_copy(d: Path) -> bool:
    return (d / COMPACT_MANIFEST).is_file()


def full_vector_set() -> Path | None:
    """The full set of reference vectors, if this machine has one (to check the compact copy against)."""
    env = os.environ.get("NGRAMCACHE_VECTORS")
    places = ([Path(env)] if env else []) + [ROOT.parent / "shared" / "vectors", ROOT / "vectors"]
    return next((d for d in places if is_full_set(d)), None)


def _vectors_source() -> Path | None:
    env = os.environ.get("NGRAMCACHE_VECTORS")
    places = [Path(env)] if env else [ROOT.parent / "shared" / "vectors", ROOT / "vectors", COMPACT_COPY]
    return next((d for d in places if is_full_set(d) or is_compact_copy(d)), None)


def read_vector_bytes(path: Path) -> bytes:
    """A vector file's contents, gunzipped when its name ends in .gz."""
    data = Path(path).read_bytes()
    return gzip.decompress(data) if str(path).endswith(".gz") else data


def _unpack(compact: Path, manifest: dict) -> Path:
    """The compact copy under the full set's file names, gunzipped, in a temporary directory
    removed at exit. The drafters' logs stay gzipped, as in the full set."""
    dest = Path(tempfile.mkdtemp(prefix="ngramcache-vectors-"))
    atexit.register(shutil.rmtree, dest, ignore_errors=True)
    for name, entry in manifest["files"].items():
        stored = compact / entry["stored"]
        data = read_vector_bytes(stored) if entry["stored"] == name + ".gz" else stored.read_bytes()
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(data)
    return dest


VECTORS_SOURCE = _vectors_source()
# The compact copy's manifest when the tests run on it, else None.
COMPACT = (json.loads((VECTORS_SOURCE / COMPACT_MANIFEST).read_text())
           if VECTORS_SOURCE is not None and is_compact_copy(VECTORS_SOURCE) else None)
VECTORS = _unpack(VECTORS_SOURCE, COMPACT) if COMPACT is not None else VECTORS_SOURCE


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    """The llama.cpp reference vectors as plain files: ../shared/vectors, the compact copy
    in tests/data, or $NGRAMCACHE_VECTORS."""
    if VECTORS is None:
        pytest.skip("reference vectors not found (../shared/vectors or tests/data; or set NGRAMCACHE_VECTORS)")
    return VECTORS


def jsonl_bytes(rows) -> bytes:
    """Rows written as the vectors' JSON-lines files are: json.dumps' defaults, one a line."""
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def full_rows_sha256(name: str) -> str:
    """SHA-256 of all the rows of the full set's JSON-lines file `name` (uncompressed): from
    the compact copy's manifest where it keeps only some rows, else hashed from the file. A
    replay's own rows, written with jsonl_bytes, hash to it exactly when every position is
    llama.cpp's, the positions the compact copy leaves out included."""
    entry = COMPACT["files"][name] if COMPACT is not None else {}
    if "rows_sha256" in entry:
        return entry["rows_sha256"]
    return hashlib.sha256(read_vector_bytes(VECTORS / name)).hexdigest()


def read_drafts(path) -> dict[int, list[int]]:
    """pos -> llama.cpp's draft, for each row of a prose.drafts.*.jsonl log: every position
    in the full set, some of them in the compact copy."""
    with open(path) as f:
        return {row["pos"]: row["draft"] for row in map(json.loads, f)}


def drafts_sha256(drafts: list) -> str:
    """SHA-256 of a replay's drafts (at pos 1, 2, ...) written as a prose.drafts.*.jsonl log."""
    rows = ({"pos": pos, "draft": d} for pos, d in enumerate(drafts, start=1))
    return hashlib.sha256(jsonl_bytes(rows)).hexdigest()


# --- the pure-Python model: strategies and comparisons for the cache and draft() tests ---

INT32_MAX = 2**31 - 1


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def as_list(cache) -> list:
    """A cache's full contents, order included: [(ngram, [(token, count), ...]), ...]."""
    return [(k, list(p.items())) for k, p in cache.items()]


def assert_same(ours: nc.NgramCache, model: dict) -> None:
    assert len(ours) == len(model)
    assert as_list(ours) == as_list(model)
    keys, offsets, toks, cnts = ours.arrays()
    assert keys.dtype == np.int32 and keys.shape == (len(model), 4)
    assert offsets.shape == (len(model) + 1,) and offsets[0] == 0
    exp_keys = np.array([ref.padded(k) for k in model], dtype=np.int32).reshape(-1, 4)
    np.testing.assert_array_equal(keys, exp_keys)
    np.testing.assert_array_equal(np.diff(offsets), [len(p) for p in model.values()])
    np.testing.assert_array_equal(toks, [t for p in model.values() for t in p])
    np.testing.assert_array_equal(cnts, [c for p in model.values() for c in p.values()])
    assert ours.to_bytes() == ref.to_bytes(model)


@st.composite
def alphabets(draw, min_size=2, max_size=6):
    """A small set of distinct token ids, extremes included now and then."""
    n = draw(st.integers(min_size, max_size))
    ids = st.one_of(st.integers(0, 9), st.integers(0, INT32_MAX), st.sampled_from([0, INT32_MAX]))
    return draw(st.lists(ids, min_size=n, max_size=n, unique=True))


@st.composite
def streams(draw, min_len=0, max_len=120, alphabet=None):
    alpha = alphabet if alphabet is not None else draw(alphabets())
    return draw(st.lists(st.sampled_from(alpha), min_size=min_len, max_size=max_len))


@st.composite
def size_ranges(draw):
    lo = draw(st.integers(1, 4))
    hi = draw(st.integers(lo, 4))
    return lo, hi


def build(tokens, ngram_min=1, ngram_max=4):
    ours, model = nc.NgramCache(), {}
    if tokens:
        ours.update(tokens, ngram_min, ngram_max)
        ref.update(model, tokens, ngram_min, ngram_max)
    return ours, model


@st.composite
def records(draw, alpha, sizes=(1, 2, 3, 4), max_count=INT32_MAX, max_records=25):
    """A lookup.bin image as a list of (key, [(token, count), ...]) with arbitrary pair
    order, and (sometimes) repeated keys and tokens."""
    out = []
    for _ in range(draw(st.integers(0, max_records))):
        n = draw(st.sampled_from(sizes))
        key = tuple(draw(st.lists(st.sampled_from(alpha), min_size=n, max_size=n)))
        pairs = draw(st.lists(st.tuples(st.sampled_from(alpha), st.integers(1, max_count)), min_size=1, max_size=6))
        out.append((key, pairs))
    return out


def image(recs) -> bytes:
    import struct
    b = bytearray()
    for key, pairs in recs:
        b += struct.pack("<5i", *ref.padded(key), len(pairs))
        for t, c in pairs:
            b += struct.pack("<2i", t, c)
    return bytes(b)


@pytest.fixture(scope="module")
def prose(vectors_dir) -> np.ndarray:
    return np.fromfile(vectors_dir / "prose.tokens.i32", dtype="<i4").astype(np.int32)


@pytest.fixture
def cache():
    c = nc.NgramCache()
    c.update([1, 2, 3, 1, 2, 3, 1, 2])
    return c


# --- replay() and `stats`: llama-lookup-stats' numbers on the vectors ------------------

# (extra flags, n_drafted, n_accept, accept as printed): vectors README, "Tool-level numbers",
# all with -c 4096 --spec-draft-n-max 8 on PROSE.
ROWS = [
    pytest.param((), 44330, 7115, "16.050%", id="no-caches"),
    pytest.param(("static",), 50387, 7938, "15.754%", id="lcs"),
    pytest.param(("static", "dynamic"), 53695, 8967, "16.700%", id="lcs+lcd"),
]
STATIC_FILE = "static-small.lcs.bin"
DYNAMIC_FILE = "dynpub.context.bin"


def summary_numbers(text: str) -> dict:
    """The values of llama-lookup-stats' summary lines found in `text`."""
    out = {}
    for label in ("n_draft", "n_predict", "n_drafted", "n_accept"):
        m = re.search(rf"^{label}\s+= (\d+)$", text, re.M)
        out[label] = int(m.group(1)) if m else None
    m = re.search(r"^accept       = (\S+)$", text, re.M)
    out["accept"] = m.group(1) if m else None
    return out


@pytest.fixture(scope="module")
def small_ngst(vectors_dir, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ngst") / "static-small.ngst"
    nc.StaticTable.from_llama(vectors_dir / STATIC_FILE).save(path)
    return path


# --- running the command line in-process -----------------------------------------------

def canonical_bytes(cache: NgramCache) -> bytes:
    """cache-stats.jsonl's canonical form: records sorted by key (signed int32 slots,
    lexicographic), pairs by token, written in the lookup.bin layout."""
    keys, offsets, toks, cnts = cache.arrays()
    offsets = offsets.astype(np.int64)
    n = np.diff(offsets)
    order = np.lexsort((keys[:, 3], keys[:, 2], keys[:, 1], keys[:, 0]))
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    # Entries in (record rank, token) order.
    rec_of_entry = np.repeat(np.arange(keys.shape[0]), n)
    eorder = np.lexsort((toks, rank[rec_of_entry]))
    n_sorted = n[order]
    out = np.empty(int((5 * order.size) + 2 * n.sum()), dtype="<i4")
    starts = np.concatenate([[0], np.cumsum(5 + 2 * n_sorted)[:-1]]).astype(np.int64)
    for j in range(4):
        out[starts + j] = keys[order, j]
    out[starts + 4] = n_sorted
    # Position of each sorted entry: its record's start + 5 + 2 * (index within the record).
    rec_sorted = np.repeat(np.arange(order.size), n_sorted)
    first = np.concatenate([[0], np.cumsum(n_sorted)[:-1]]).astype(np.int64)
    within = np.arange(eorder.size) - first[rec_sorted]
    pos = starts[rec_sorted] + 5 + 2 * within
    out[pos] = toks[eorder]
    out[pos + 1] = cnts[eorder]
    return out.tobytes()


def canonical_sha(path) -> str:
    return hashlib.sha256(canonical_bytes(NgramCache.load(path))).hexdigest()


def cache_stats(vectors_dir: Path) -> dict:
    rows = [json.loads(line) for line in (vectors_dir / "cache-stats.jsonl").read_text().splitlines() if line.strip()]
    return {r["file"]: r for r in rows}


def run_cli(capsys, *argv):
    """main(argv) -> (exit code, stdout, stderr); argparse's own exits count as codes."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *argv) -> dict:
    rc, out, err = run_cli(capsys, *argv, "--json", "--quiet")
    assert rc == 0, err
    assert err == ""
    return json.loads(out)


# --- generate and demo with a fake llama-cpp-python model ------------------------------

PROMPT_CASES = [
    # (flags, file content or None, the prompt the model must see)
    (["-p", "say\\tthis\\n"], None, b"say\tthis\n"),
    (["-p", "say\\tthis\\n", "--no-escape"], None, b"say\\tthis\\n"),
    (["-p", "two lines\n"], None, b"two lines\n"),  # -p keeps a trailing newline
    (["-f"], b"col\\x41\\tend\n", b"colA\tend"),  # one trailing newline dropped, escapes processed
    (["-f", "--no-escape"], b"col\\x41\\tend\n\n", b"col\\x41\\tend\n"),
]


def _prompt_argv(tmp_path, flags, content):
    if content is None:
        return list(flags)
    f = tmp_path / "prompt.txt"
    f.write_bytes(content)
    return ["-f", f] + flags[1:]


class _FakeBackend:
    def piece(self, tok):
        return b"<%d>" % tok

    def tokenize(self, prompt):
        return np.frombuffer(prompt, dtype=np.uint8).astype(np.int32)


def _fake_result(prompt, text="<7><8>"):
    from types import SimpleNamespace
    return SimpleNamespace(n_prompt=len(prompt), t_prompt=0.01, n_tokens=2, t_total=0.05, drafted=1, accepted=1,
                           t_draft=1e-4, t_verify=0.03, steps=1, stop_reason="length", text=text,
                           tokens=np.array([7, 8], dtype=np.int32), gen_tokens_per_s=50.0, e2e_tokens_per_s=40.0)


@pytest.fixture
def fake_llama(monkeypatch, tmp_path):
    """ngramcache.integrations.llama with a fake model: records every prompt given to generate."""
    from types import ModuleType, SimpleNamespace
    import ngramcache.integrations.llama as nl
    seen = []

    def generate(llm, prompt, drafter=None, max_tokens=128, on_tokens=None, **kw):
        seen.append(prompt)
        if on_tokens is not None:
            on_tokens([7, 8], 1)
        return _fake_result(prompt)

    def generate_llama_cpp(llm, prompt, max_tokens=128):
        seen.append(prompt)
        return _fake_result(prompt)

    monkeypatch.setattr(nl, "make_llama", lambda *a, **k: object())
    monkeypatch.setattr(nl.LlamaBackend, "of", classmethod(lambda cls, llm: _FakeBackend()))
    monkeypatch.setattr(nl, "generate", generate)
    monkeypatch.setattr(nl, "generate_llama_cpp", generate_llama_cpp)
    monkeypatch.setattr(nl, "CountingDraftModel", lambda inner: inner)
    monkeypatch.setattr(nl, "adaptive_drafter", lambda llm, **k: gated_drafter([1.0, 1.5], "copy", 1))
    spec = ModuleType("llama_cpp.llama_speculative")
    spec.LlamaPromptLookupDecoding = lambda: object()
    if importlib.util.find_spec("llama_cpp") is None:
        monkeypatch.setitem(sys.modules, "llama_cpp", ModuleType("llama_cpp"))
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", spec)
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"GGUF")
    return seen, model


# --- real models -----------------------------------------------------------------------

# ggml reads its tiled-matmul switch once, at the first matrix product of the process: set here,
# it holds for every model of the session, whichever test loads one first (make_llama sets it
# too, but a test that builds a llama_cpp.Llama itself may come earlier)
os.environ.setdefault("GGML_CPU_TILED_MM", "0")


def _prompts() -> list[str]:
    text, _ = data.prose(2400)
    paras = [p for p in text.split("\n\n") if len(p) > 200]
    fn = data.stdlib_function
    code = [fn("posixpath.py", "relpath"), fn("textwrap.py", "dedent"), fn("shlex.py", "quote"),
            fn("posixpath.py", "commonpath"), fn("genericpath.py", "commonprefix")]
    return [
        "Copy this function exactly.\n\n```python\n" + code[0] + "```\n\nCopy:\n\n```python\n",
        "Add type hints.\n\n```python\n" + code[2] + "```\n\nWith type hints:\n\n```python\n",
        code[1][:600] + "\n\n# The same function again:\n",
        paras[0] + "\n\nRepeat the paragraph above word for word:\n\n",
        paras[-1] + "\n\nQuestion: what is this about? Answer in one sentence.\nAnswer:",
        "The capital of France is",
        "Rename the function to common_path.\n\n```python\n" + code[3] + "```\n\nRenamed:\n\n```python\n",
        "```python\n" + code[4] + "```\n\nThe same code:\n\n```python\n",
        paras[1] + "\n\nQuote the first sentence of the text above.\n\n",
    ]


PROMPTS = _prompts()


@pytest.fixture(scope="module")
def gemma_path():
    """The packaged Gemma GGUF; skips without llama-cpp-python or the model package."""
    pytest.importorskip("llama_cpp")
    try:
        return default_model_path("gemma")
    except FileNotFoundError as e:
        pytest.skip(str(e))


# --- a deterministic fake model --------------------------------------------------------

V = 64


def next_token(prefix: list[int]) -> int:
    """A fixed function of the whole prefix that copies a lot (so lookup drafts are
    often right) but not always (so they are also often wrong)."""
    n = len(prefix)
    h = (sum(prefix[-3:]) * 31 + n // 7) % 11
    if h < 7 and n >= 12:
        return prefix[n - 12]  # copy the token 12 back
    return (prefix[-1] * 5 + prefix[-2] * 3 + 1) % V if n >= 2 else 1


def reference(prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    seq = list(prompt)
    out = []
    for _ in range(n):
        t = next_token(seq)
        out.append(t)
        seq.append(t)
        if t == eos:
            break
    return out


PROMPT = [(i * 7 + 3) % V for i in range(40)]


# --- real text -------------------------------------------------------------------------

def _stdlib_text(limit: int) -> bytes:
    lib = Path(sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for name in ["collections/__init__.py", "functools.py", "inspect.py", "argparse.py", "typing.py",
                 "pathlib.py", "dataclasses.py", "enum.py"]:
        p = lib / name
        if p.is_file():
            out.append(p.read_bytes())
            total += len(out[-1])
        if total >= limit:
            break
    return b"".join(out)[:limit]


# --- a run that lacks a model --------------------------------------------------------------
# A test skipped because llama-cpp-python, torch, transformers or a packaged model is missing
# tests nothing; the exactness tests are among them. scripts/test sets NGRAMCACHE_REQUIRE_MODELS=1
# (unless NGRAMCACHE_ALLOW_PARTIAL=1 asks for a partial run), and such a skip then fails.

MISSING_MODEL = re.compile(r"could not import '(llama_cpp|torch|transformers)'|llama-cpp-python not installed"
                           r"|packaged model '[^']*' needs the package|missing from the [\w.-]+ package"
                           r"|\(package [\w.-]+\) not installed")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and os.environ.get("NGRAMCACHE_REQUIRE_MODELS") == "1"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    if MISSING_MODEL.search(reason):
        report.outcome = "failed"
        report.longrepr = (f"{reason}\nA missing model or model runtime fails this run "
                           "(NGRAMCACHE_REQUIRE_MODELS=1, as scripts/test sets it); "
                           "NGRAMCACHE_ALLOW_PARTIAL=1 scripts/test asks for a partial run instead.")
