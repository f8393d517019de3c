"""ngramcache.corpus.tokenizers: loading GGUF and Hugging Face tokenizers, their errors, and
tokenizing text and files exactly as llama.cpp's tools do."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import _stdlib_text
from ngramcache import models as M
import ngramcache.corpus.text as TX
import ngramcache.corpus.tokenizers as T

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
HAVE_HF = importlib.util.find_spec("tokenizers") is not None
needs_llama = pytest.mark.skipif(not HAVE_LLAMA, reason="llama-cpp-python not installed")
needs_hf = pytest.mark.skipif(not HAVE_HF, reason="Hugging Face 'tokenizers' not installed (extra 'hf')")


# --- loading tokenizers: errors that need no model -------------------------------------

def test_load_tokenizer_arguments(tmp_path):
    with pytest.raises(ValueError, match="exactly one"):
        T.load_tokenizer()
    with pytest.raises(ValueError, match="exactly one"):
        T.load_tokenizer(model="a.gguf", tokenizer_json="t.json")
    with pytest.raises(FileNotFoundError, match="missing.gguf: model file not found"):
        T.load_tokenizer(model=tmp_path / "missing.gguf")
    notgguf = tmp_path / "x.gguf"
    notgguf.write_bytes(b"NOPE" + b"\0" * 64)
    with pytest.raises(ValueError, match="x.gguf: not a GGUF model file"):
        T.load_tokenizer(model=notgguf)
    with pytest.raises(ValueError, match="unknown packaged model 'llama9'"):
        M.default_model_path("llama9")


@needs_llama
def test_truncated_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(ValueError, match="bad.gguf: llama.cpp could not load this model's vocabulary"):
        T.load_tokenizer(model=bad)


# --- real tokenizers -------------------------------------------------------------------

def _smollm2_path():
    try:
        return M.default_model_path("smollm2")
    except FileNotFoundError as e:
        pytest.skip(str(e))


def _gemma_path():
    try:
        return M.default_model_path("gemma")
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def smollm2():
    if not HAVE_LLAMA:
        pytest.skip("llama-cpp-python not installed")
    return T.load_tokenizer(model=_smollm2_path())


@pytest.fixture(scope="module")
def gemma():
    if not HAVE_LLAMA:
        pytest.skip("llama-cpp-python not installed")
    return T.load_tokenizer(model=_gemma_path())


@pytest.mark.model
@pytest.mark.parametrize("name", ["prose", "dynpub", "small-static"])
def test_vector_texts_tokenize_exactly(smollm2, vectors_dir, name):
    want = np.fromfile(vectors_dir / f"{name}.tokens.i32", dtype="<i4")
    data = (vectors_dir / f"{name}.txt").read_bytes()
    single = T.tokenize_text(data, smollm2, name=name)
    assert single.dtype == np.int32
    np.testing.assert_array_equal(single, want)
    # Piecewise (the default of tokenize_files) gives the same tokens for this BPE tokenizer.
    pieces = T.tokenize_files([vectors_dir / f"{name}.txt"], smollm2, jobs=1, piece_bytes=16_384)
    np.testing.assert_array_equal(pieces, want)


@pytest.mark.model
def test_smollm2_facts(smollm2, vectors_dir):
    # No BOS (the GGUF says add_bos = false), no EOS; special-token text is parsed.
    assert smollm2.prefix.size == 0 and smollm2.suffix.size == 0
    assert smollm2.rejects_above_max_codepoint
    assert smollm2.tokenize(b"<|im_start|>").tolist() == [1]
    assert smollm2.tokenize(b"<|im_start|>", parse_special=False).size > 1
    # The escape step matters on the small static corpus: 139 bytes fewer.
    raw = (vectors_dir / "small-static.txt").read_bytes()
    assert len(raw) - len(TX.prepare_text(raw)) == 139
    assert len(TX.prepare_text(raw, escape=False)) == len(raw)


@pytest.mark.model
def test_same_call_as_llama_class(smollm2, gemma):
    """Llama(vocab_only).tokenize(add_bos=True, special=True) is the call the tools make:
    add_bos is passed on as add_special, which adds BOS only where the GGUF asks for it."""
    import llama_cpp
    text = b"Hello <|im_start|> world\n\nclass X:\n    pass"
    for tok in (smollm2, gemma):
        llm = llama_cpp.Llama(model_path=tok.path, vocab_only=True, verbose=False)
        try:
            want = llm.tokenize(text, add_bos=True, special=True)
        finally:
            llm.close()
        assert tok.tokenize(text).tolist() == want
    assert gemma.prefix.tolist() == [2] and gemma.suffix.size == 0  # Gemma adds <bos>


@pytest.mark.model
def test_gemma_pieces_add_one_bos_and_match_single_call(gemma):
    text = _stdlib_text(200_000)
    single = T.tokenize_text(text + b"\n", gemma)
    assert single[0] == 2 and (single == 2).sum() == 1
    pieces = T.tokenize_text(text + b"\n", gemma, piece_bytes=16_384)
    assert (pieces == 2).sum() == 1  # one BOS for the text, none per piece
    np.testing.assert_array_equal(pieces, single)
    # SentencePiece works on bytes: no abort, so no error for such text.
    assert not gemma.rejects_above_max_codepoint
    assert T.tokenize_text(b"a\xf4\x90\x80\x80b", gemma).size > 2


@pytest.mark.model
def test_tokenize_text_rejects_what_llama_cpp_aborts_on(smollm2, tmp_path):
    with pytest.raises(TX.InvalidTextError, match=r"doc.txt: byte offset 5: .*U\+110000"):
        T.tokenize_text(b"hello\xf4\x90\x80\x80", smollm2, name="doc.txt")
    f = tmp_path / "esc.txt"
    f.write_bytes(b"s = '\\xf4\\x90\\x80\\x80'\n")
    with pytest.raises(TX.InvalidTextError, match=r"esc.txt: byte offset 5: .*escape sequence"):
        T.tokenize_files([f], smollm2, jobs=1)
    # With --no-escape the same file is plain ASCII.
    assert T.tokenize_files([f], smollm2, jobs=1, escape=False).size > 5


@pytest.mark.model
def test_llama_cpp_really_aborts_on_that_text():
    """The reason for the check: the BPE tokenizer throws and nothing catches it."""
    if not HAVE_LLAMA:
        pytest.skip("llama-cpp-python not installed")
    code = ("import sys; from ngramcache.corpus.tokenizers import load_tokenizer as L; t = L(sys.argv[1]); "
            "t.tokenize(b'ok \\xf4\\x8f\\xbf\\xbf'); print('fine', flush=True); t.tokenize(b'a\\xf4\\x90\\x80\\x80')")
    env = dict(os.environ, GGML_NO_BACKTRACE="1")  # no gdb backtrace on the abort
    r = subprocess.run([sys.executable, "-c", code, _smollm2_path()], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.stdout.splitlines()[0] == "fine"
    assert r.returncode != 0 and "invalid codepoint" in r.stderr


@pytest.mark.model
@pytest.mark.slow
def test_parallel_workers_give_the_same_tokens(smollm2, vectors_dir, monkeypatch):
    monkeypatch.setattr(T, "PARALLEL_MIN_BYTES", 0)
    want = np.fromfile(vectors_dir / "small-static.tokens.i32", dtype="<i4")
    seen = []

    class Bar:
        def update(self, n):
            seen.append(n)

    got = T.tokenize_files([vectors_dir / "small-static.txt"], smollm2, jobs=2, progress=Bar())
    np.testing.assert_array_equal(got, want)
    # Every input byte is reported, including those the newline/escape steps removed.
    assert sum(seen) == (vectors_dir / "small-static.txt").stat().st_size and len(seen) > 5
    # Whole files (one call each) spread over the workers, results in order.
    names = ["prose", "dynpub", "small-static"]
    got = T.tokenize_files([vectors_dir / f"{n}.txt" for n in names], smollm2, jobs=2, piece_bytes=0)
    want = np.concatenate([np.fromfile(vectors_dir / f"{n}.tokens.i32", dtype="<i4") for n in names])
    np.testing.assert_array_equal(got, want)


@pytest.mark.model
def test_several_files_concatenate(smollm2, vectors_dir):
    a, b = vectors_dir / "prose.txt", vectors_dir / "dynpub.txt"
    got = T.tokenize_files([a, b], smollm2, jobs=1)
    want = np.concatenate([np.fromfile(vectors_dir / "prose.tokens.i32", "<i4"),
                           np.fromfile(vectors_dir / "dynpub.tokens.i32", "<i4")])
    np.testing.assert_array_equal(got, want)


# --- Hugging Face tokenizer.json -------------------------------------------------------

@pytest.fixture(scope="module")
def hf_json(tmp_path_factory):
    if not HAVE_HF:
        pytest.skip("Hugging Face 'tokenizers' not installed (extra 'hf')")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<s>", "</s>", "<|sep|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([_stdlib_text(120_000).decode()], trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 1)])
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    tok.save(str(path))
    return path


@needs_hf
def test_hf_tokenizer(hf_json, tmp_path):
    from tokenizers import Tokenizer
    ref = Tokenizer.from_file(str(hf_json))
    tok = T.load_tokenizer(tokenizer_json=hf_json)
    assert tok.prefix.tolist() == [0] and tok.suffix.tolist() == [1]
    text = _stdlib_text(150_000)
    got = T.tokenize_text(text + b"\n", tok)
    prepared = TX.prepare_text(text + b"\n")
    assert prepared != text  # escapes in the source code were processed
    assert got.tolist() == ref.encode(prepared.decode(), add_special_tokens=True).ids
    # Special-token text is matched (parse_special), as in llama.cpp.
    assert tok.tokenize(b"a<|sep|>b", add_special=False).tolist().count(2) == 1
    f = tmp_path / "c.txt"
    f.write_bytes(text + b"\n")
    np.testing.assert_array_equal(T.tokenize_files([f], tok, piece_bytes=8192), got)
    # No abort hazard here: text above U+10FFFF decodes to U+FFFD.
    assert not tok.rejects_above_max_codepoint
    assert T.tokenize_text(b"a\xf4\x90\x80\x80", tok).size >= 3


@needs_hf
def test_hf_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer file not found"):
        T.load_tokenizer(tokenizer_json=tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="bad.json: not a usable tokenizer.json"):
        T.load_tokenizer(tokenizer_json=bad)


def test_hf_missing_package_message(monkeypatch, tmp_path):
    f = tmp_path / "tokenizer.json"
    f.write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"pip install 'ngramcache\[hf\]'"):
        T.load_tokenizer(tokenizer_json=f)
