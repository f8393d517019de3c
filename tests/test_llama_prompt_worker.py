"""Prompts through your own llama-cpp-python build in a worker process, the tokens after them
through the exact one (ngramcache.integrations.llama_prompt_worker). The suite has no default
build, so the worker here runs the installed build from a folder that links to it, loading
the model with llama-cpp-python's own defaults (weights repacked): the same frames, hand-overs
and sliding windows as with a build of llamafile's kernels, and drafting must still give plain
decoding's tokens (==)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ngramcache.models import default_model_path

llama_cpp = pytest.importorskip("llama_cpp")
import ngramcache.integrations.llama as llama_module  # noqa: E402
import ngramcache.llama as nl  # noqa: E402
from ngramcache.decoding.loop import PromptCache  # noqa: E402
from ngramcache.drafters.registry import make_drafter  # noqa: E402
from ngramcache.integrations import exactness  # noqa: E402
from ngramcache.integrations.default_build import BUILD_ENV  # noqa: E402
from ngramcache.integrations.llama_prompt_worker import PromptWorker  # noqa: E402

N = 24
TEXT = ("The lighthouse keeper climbed the stairs every evening at dusk. He wound the clockwork, trimmed "
        "the wick and polished the great lens until it shone. Ships passed in the dark and never knew his "
        "name, but they knew his light. ") * 6


def _path(name: str) -> str:
    try:
        return default_model_path(name)
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def build_folder(tmp_path_factory):
    """A folder holding the installed llama_cpp package, standing for a build of the user's own."""
    folder = tmp_path_factory.mktemp("your-build")
    os.symlink(os.path.dirname(llama_cpp.__file__), folder / "llama_cpp")
    return folder


@pytest.fixture(scope="module")
def gemma(build_folder):
    path = _path("gemma")
    mp = pytest.MonkeyPatch()
    mp.setenv(BUILD_ENV, str(build_folder))
    try:
        llm = nl.make_llama(path, n_ctx=2048, n_batch=256)
    finally:
        mp.undo()
    one = nl.make_llama(path, n_ctx=2048, n_batch=256, prompt_layout=False)
    yield llm, one
    llm._ngramcache_prompt_layout.close()
    llm.close()
    one.close()


class _Counting:
    """Counts the worker's prefills and hand-overs."""

    def __init__(self, layout):
        self.layout, self.prefills, self.hand_overs = layout, 0, 0
        self._prefill, self._hand_over = layout.prefill, layout.hand_over
        layout.prefill = self.prefill
        layout.hand_over = self.hand_over

    def prefill(self, *a):
        self.prefills += 1
        return self._prefill(*a)

    def hand_over(self, *a):
        self.hand_overs += 1
        return self._hand_over(*a)

    def restore(self):
        del self.layout.prefill, self.layout.hand_over


@pytest.mark.model
def test_a_build_of_your_own_is_taken_for_prompts(gemma, build_folder, monkeypatch):
    llm, one = gemma
    worker = llm._ngramcache_prompt_layout
    assert isinstance(worker, PromptWorker) and worker.folder == build_folder
    assert worker.memory_bytes > 10 * 2**20  # a second process holding the model
    assert "your llama-cpp-python build" in exactness.configuration(llm)
    assert getattr(one, "_ngramcache_prompt_layout", None) is None
    monkeypatch.setenv(BUILD_ENV, str(build_folder))
    with_drafter = nl.make_llama(_path("gemma"), drafter=make_drafter("copy"), n_ctx=512)
    try:  # llama-cpp-python's own loop decodes its prompts itself
        assert getattr(with_drafter, "_ngramcache_prompt_layout", None) is None
    finally:
        with_drafter.close()


@pytest.mark.model
def test_drafting_equals_plain_through_the_worker(gemma):
    llm, _ = gemma
    counting = _Counting(llm._ngramcache_prompt_layout)
    try:
        prompts = [TEXT + "\n\nRepeat the story word for word:\n", "def add(a, b):\n    return a + b\n" * 12]
        for prompt in prompts:
            plain = nl.generate(llm, prompt, None, N)
            for name in ("copy", "suffix"):
                drafted = nl.generate(llm, prompt, make_drafter(name, n_draft=8), N)
                assert drafted.tokens.tolist() == plain.tokens.tolist(), (name, prompt[:20])
        assert counting.prefills >= 6 and counting.hand_overs >= 6  # the prompts went through the worker
    finally:
        counting.restore()


@pytest.mark.model
def test_the_handed_over_cache_is_the_prompts(gemma):
    # the worker's KV cache continues the prompt: the first row is the one-layout model's up to
    # the repacked kernels' rounding, and the text goes on the same way for a while
    llm, one = gemma
    rows = {}
    a = nl.generate(llm, TEXT, None, 8, on_logits=lambda i, r: rows.setdefault(("two", i), r.copy()))
    b = nl.generate(one, TEXT, None, 8, on_logits=lambda i, r: rows.setdefault(("one", i), r.copy()))
    r2, r1 = rows[("two", 0)], rows[("one", 0)]
    assert np.corrcoef(r1, r2)[0, 1] > 0.99
    assert int(np.argmax(r1)) == int(np.argmax(r2))
    assert a.tokens[:4].tolist() == b.tokens[:4].tolist()


@pytest.mark.model
def test_prompt_cache_turns_stay_equal(gemma):
    # a prompt longer than n_batch (pieces), then turns on one prompt cache: the worker is sent
    # the exact context's cache (earlier answers came from the exact kernels)
    llm, _ = gemma
    long = TEXT * 3 + "\n\nNow the same story once more:\n"
    turns = (long, "\nAnd again, shorter:\n", TEXT[:400] + "\nOnce more:\n")

    def chat(drafter_name):
        cache, history, outs = PromptCache(), "", []
        for turn in turns:
            history += turn
            drafter = make_drafter(drafter_name, n_draft=8) if drafter_name else None
            r = nl.generate(llm, history, drafter, N, prompt_cache=cache)
            outs.append(r.tokens.tolist())
            history += r.text
        return outs

    assert chat("copy") == chat(None)


@pytest.mark.model
def test_a_worker_that_dies_is_named_and_does_not_hang(build_folder, monkeypatch):
    monkeypatch.setenv(BUILD_ENV, str(build_folder))
    llm = nl.make_llama(_path("smollm2"), n_ctx=512)
    try:
        worker = llm._ngramcache_prompt_layout
        assert isinstance(worker, PromptWorker)
        worker._proc.kill()
        worker._proc.wait()
        with pytest.raises(RuntimeError, match="prompt worker"):
            nl.generate(llm, TEXT, None, 4)
    finally:
        llm.close()
    worker.close()  # twice is harmless
    worker.close()


@pytest.mark.model
def test_a_build_that_cannot_start_is_said_once_and_prompts_stay_here(tmp_path, monkeypatch, capsys):
    broken = tmp_path / "broken"
    (broken / "llama_cpp").mkdir(parents=True)
    (broken / "llama_cpp" / "__init__.py").write_text("raise ImportError('not a build')\n")
    monkeypatch.setenv(BUILD_ENV, str(broken))
    monkeypatch.setattr(llama_module, "_worker_failure_said", False)
    for _ in range(2):
        llm = nl.make_llama(_path("smollm2"), n_ctx=512)
        try:
            assert getattr(llm, "_ngramcache_prompt_layout", None) is None
            assert nl.generate(llm, TEXT, None, 4).n_tokens == 4
        finally:
            llm.close()
    err = capsys.readouterr().err
    assert err.count("did not start") == 1 and "not a build" in err


@pytest.mark.model
def test_closing_the_worker_ends_its_process(build_folder, monkeypatch):
    monkeypatch.setenv(BUILD_ENV, str(build_folder))
    llm = nl.make_llama(_path("smollm2"), n_ctx=512)
    worker = llm._ngramcache_prompt_layout
    proc = worker._proc
    assert proc.poll() is None
    worker.close()
    assert proc.poll() is not None
    llm.close()
