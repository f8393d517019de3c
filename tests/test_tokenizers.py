"""ngramcache.tokenizers: llama.cpp's text handling, tokenizers, token files; progress."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ngramcache import files as F
from ngramcache import models as M
from ngramcache import text as TX
from ngramcache import tokenizers as T
from ngramcache.progress import Progress, fmt_bytes, fmt_count, fmt_seconds, peak_rss_bytes

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
HAVE_HF = importlib.util.find_spec("tokenizers") is not None
needs_llama = pytest.mark.skipif(not HAVE_LLAMA, reason="llama-cpp-python not installed")
needs_hf = pytest.mark.skipif(not HAVE_HF, reason="Hugging Face 'tokenizers' not installed (extra 'hf')")


# ---------------------------------------------------------------------------------------
# An independent transcription of llama.cpp's string_process_escapes (common.cpp), byte by
# byte, with strtol's rules for the two characters after "\x".
# ---------------------------------------------------------------------------------------

def _strtol16_two(c1: int, c2: int):
    """strtol(x, &end, 16) on the NUL-terminated 2-char string; value if end == x + 2."""
    s = bytes([c1, c2])
    i = 0
    while i < 2 and s[i] in b" \t\n\v\f\r":
        i += 1
    neg = False
    if i < 2 and s[i] in b"+-":
        neg = s[i] == ord("-")
        i += 1
    start = i
    val = 0
    while i < 2 and chr(s[i]) in "0123456789abcdefABCDEF":
        val = val * 16 + int(chr(s[i]), 16)
        i += 1
    if i == start or i != 2:
        return None
    return -val if neg else val


def reference_escapes(data: bytes) -> bytes:
    out = bytearray()
    n = len(data)
    i = 0
    simple = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("'"): 39, ord('"'): 34, ord("\\"): 92}
    while i < n:
        c = data[i]
        if c == 0x5C and i + 1 < n:
            i += 1
            e = data[i]
            if e in simple:
                out.append(simple[e])
            elif e == ord("x") and i + 2 < n and data[i + 1] != 0 and (v := _strtol16_two(data[i + 1], data[i + 2])) is not None:
                i += 2
                out.append(v & 0xFF)
            else:
                out += bytes([0x5C, e])
        else:
            out.append(c)
        i += 1
    return bytes(out)


@pytest.mark.parametrize("src, want", [
    (rb"a\nb", b"a\nb"),
    (rb"a\rb", b"a\rb"),
    (rb"a\tb", b"a\tb"),
    (rb"\'q\'", b"'q'"),
    (rb'\"q\"', b'"q"'),
    (rb"back\\slash", b"back\\slash"),
    (rb"\\n", b"\\n"),                 # an escaped backslash, then a plain n
    (rb"\\\n", b"\\\n"),               # escaped backslash, then an escaped newline
    (rb"\x41\x62", b"Ab"),
    (rb"\xff", b"\xff"),
    (rb"\x00", b"\x00"),
    (rb"\x4", rb"\x4"),                # too short at the end: kept
    (rb"\x", rb"\x"),
    (rb"\xZZ", rb"\xZZ"),
    (rb"\x4G", rb"\x4G"),
    (rb"\x 5", b"\x05"),               # strtol skips leading whitespace
    (rb"\x+5", b"\x05"),               # ... and takes a sign
    (rb"\x-1", b"\xff"),               # char(-1)
    (rb"\x0x", rb"\x0x"),
    (rb"\q \d \0 \u1234", rb"\q \d \0 \u1234"),  # other pairs stay as they are
    (b"end\\", b"end\\"),              # a lone backslash at the very end
    (b"no escapes at all", b"no escapes at all"),
])
def test_escapes(src, want):
    assert TX.process_escapes(src) == want
    assert reference_escapes(src) == want


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from([b"\\", b"x", b"n", b"t", b"r", b"'", b'"', b"4", b"f", b"F", b"g", b" ", b"+",
                                 b"-", b"\n", b"\x00", b"0", b"a", b"\xf4"]), max_size=40))
def test_escapes_match_reference(parts):
    data = b"".join(parts)
    assert TX.process_escapes(data) == reference_escapes(data)


@pytest.mark.parametrize("src, want", [
    (b"abc\n", b"abc"),
    (b"abc\n\n", b"abc\n"),       # only ONE newline goes
    (b"abc", b"abc"),
    (b"abc\r\n", b"abc\r"),
    (b"\n", b""),
    (b"", b""),
    (b"a\\\n", b"a\\"),           # the newline goes before escapes: the backslash stays
    (b"a\\n\n", b"a\n"),          # the trailing newline goes, then \n becomes one
])
def test_prepare_text_trailing_newline_then_escapes(src, want):
    assert TX.prepare_text(src) == want


def test_prepare_text_no_escape():
    assert TX.prepare_text(b"a\\tb\\x41\n", escape=False) == b"a\\tb\\x41"


def test_prepare_text_rejects_str():
    with pytest.raises(TypeError, match="bytes"):
        TX.prepare_text("text")


# -- invalid code points ----------------------------------------------------------------

@pytest.mark.parametrize("text, offset", [
    (b"\xf4\x90\x80\x80", 0),          # U+110000
    (b"abc\xf4\x90\x80\x80def", 3),
    (b"ab\xf5\x80\x80\x80", 2),        # F5 lead: U+140000
    (b"ab\xf7\xbf\xbf\xbf", 2),        # the largest 4-byte value
    (b"\xe0\xf4\x90\x80\x80", 1),      # a broken 3-byte lead before it: skipped, then found
    (b"ok \xf0\x9f\x98\x80 \xf4\xbf\xbf\xbf", 8),
])
def test_invalid_codepoint_named_with_offset(text, offset):
    with pytest.raises(TX.InvalidTextError) as ei:
        TX.check_codepoints(text, "corpus.txt")
    e = ei.value
    assert e.offset == offset and e.path == "corpus.txt"
    assert f"corpus.txt: byte offset {offset}:" in str(e)
    assert "above U+10FFFF" in str(e)


@pytest.mark.parametrize("text", [
    b"\xf4\x8f\xbf\xbf",        # U+10FFFF itself is fine
    b"\xf0\x9f\x98\x80",        # an emoji
    b"\xf4\x90\x80",            # truncated at the end: llama.cpp replaces it, no error
    b"\xf4\x90\x80x",           # not followed by continuations
    b"\xff\xfe\x80",            # other invalid UTF-8
    b"\xed\xa0\x80",            # a surrogate: decoded and re-encoded without complaint
    b"\xf8\x88\x80\x80\x80",    # 5-byte lead: invalid, replaced
])
def test_other_invalid_utf8_accepted(text):
    TX.check_codepoints(text, "x")


def test_invalid_codepoint_from_escape_points_into_the_file():
    src = b"0123\\t\\xF4\\x90\\x80\\x80 tail\n"
    with pytest.raises(TX.InvalidTextError) as ei:
        TX.prepare_text(src, name="f.py")
    assert ei.value.offset == 6  # the backslash of \xF4 in the file
    assert "escape sequence" in str(ei.value) and "--no-escape" in str(ei.value)
    # The same bytes as escapes kept as text are plain ASCII.
    assert TX.prepare_text(src, escape=False, name="f.py").startswith(b"0123\\t")


def test_invalid_codepoint_literal_offset_after_escapes_counts_file_bytes():
    src = b"\\n\\n\\n\xf4\x90\x80\x80"
    with pytest.raises(TX.InvalidTextError) as ei:
        TX.prepare_text(src, name="f")
    assert ei.value.offset == 6 and "escape" not in str(ei.value)


def test_check_can_be_skipped():
    assert TX.prepare_text(b"\xf4\x90\x80\x80", check=False) == b"\xf4\x90\x80\x80"


# -- pieces -----------------------------------------------------------------------------

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


def test_split_pieces_cut_points_and_sizes():
    text = _stdlib_text(400_000)
    pieces = TX.split_pieces(text, 16_384)
    assert b"".join(pieces) == text
    assert len(pieces) > 10
    ok = [i for i in range(2, len(text)) if TX._is_cut(text, i)]
    pos = 0
    for p in pieces[:-1]:
        start, pos = pos, pos + len(p)
        # Each cut is right after a lone newline between two non-space bytes.
        assert text[pos - 1:pos] == b"\n"
        assert text[pos - 2] not in b" \t\r\n\v\f" and text[pos] not in b" \t\r\n\v\f"
        if len(p) > 16_384:
            # Longer only where no cut point existed within the limit.
            assert not [i for i in ok if start < i <= start + 16_384]
        else:
            # Cut at the latest point within the limit.
            assert not [i for i in ok if pos < i <= start + 16_384]


def test_split_pieces_degenerate():
    assert TX.split_pieces(b"", 10) == [b""]
    assert TX.split_pieces(b"short", 10) == [b"short"]
    assert TX.split_pieces(b"x" * 100, 0) == [b"x" * 100]
    no_cut = b"    indented\n" * 50  # every line starts with spaces: nowhere to cut
    assert TX.split_pieces(no_cut, 64) == [no_cut]
    text = b"aaaa\nbbbb\ncccc\ndddd"
    pieces = TX.split_pieces(text, 6)
    assert b"".join(pieces) == text and pieces == [b"aaaa\n", b"bbbb\n", b"cccc\n", b"dddd"]


# -- token files ------------------------------------------------------------------------

def test_read_tokens_raw_and_npy(tmp_path):
    toks = np.array([0, 5, 2**31 - 1, 49151], dtype=np.int64)
    raw = tmp_path / "t.i32"
    toks.astype("<i4").tofile(raw)
    got = F.read_tokens_file(raw)
    assert got.dtype == np.int32 and got.tolist() == toks.tolist()
    npy = tmp_path / "t.npy"
    np.save(npy, toks)
    assert F.read_tokens_file(npy).tolist() == toks.tolist()
    # Content decides, not the name: a .npy image under another name still loads.
    other = tmp_path / "t.bin"
    other.write_bytes(npy.read_bytes())
    assert F.read_tokens_file(other).tolist() == toks.tolist()
    F.write_tokens_file(tmp_path / "w.i32", toks)
    assert (tmp_path / "w.i32").read_bytes() == raw.read_bytes()
    empty = tmp_path / "e.i32"
    empty.write_bytes(b"")
    assert F.read_tokens_file(empty).size == 0


def test_read_tokens_errors(tmp_path):
    odd = tmp_path / "odd.i32"
    odd.write_bytes(b"\x01\x00\x00\x00\x02\x00")
    with pytest.raises(ValueError, match=r"odd.i32: 6 bytes is not a whole number of int32"):
        F.read_tokens_file(odd)
    neg = tmp_path / "neg.i32"
    np.array([1, -7, 3], dtype="<i4").tofile(neg)
    with pytest.raises(ValueError, match=r"neg.i32: negative token id -7 at index 1"):
        F.read_tokens_file(neg)
    fl = tmp_path / "f.npy"
    np.save(fl, np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"f.npy: token ids must be integers"):
        F.read_tokens_file(fl)
    two = tmp_path / "2d.npy"
    np.save(two, np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(ValueError, match=r"2d.npy.*1-D"):
        F.read_tokens_file(two)
    big = tmp_path / "big.npy"
    np.save(big, np.array([1, 2**40], dtype=np.int64))
    with pytest.raises(ValueError, match=r"big.npy.*int32"):
        F.read_tokens_file(big)
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"\x93NUMPY\x01\x00garbage")
    with pytest.raises(ValueError, match=r"bad.npy: not a readable .npy"):
        F.read_tokens_file(bad)
    with pytest.raises(FileNotFoundError):
        F.read_tokens_file(tmp_path / "missing.i32")
    with pytest.raises(ValueError, match="directory"):
        F.read_tokens_file(tmp_path)


# -- inputs -----------------------------------------------------------------------------

def test_expand_inputs(tmp_path):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / ".hidden").mkdir()
    (d / "__pycache__").mkdir()
    (d / "b.txt").write_bytes(b"b")
    (d / "a.txt").write_bytes(b"a")
    (d / "sub" / "c.txt").write_bytes(b"c")
    (d / ".hidden" / "h.txt").write_bytes(b"h")
    (d / ".dot.txt").write_bytes(b"h")
    (d / "__pycache__" / "x.pyc").write_bytes(b"\0\0")
    (d / "blob.bin").write_bytes(b"ab\0cd")
    single = tmp_path / "single.txt"
    single.write_bytes(b"s")
    files, skipped = F.expand_inputs([single, d])
    assert [f.relative_to(tmp_path).as_posix() for f in files] == [
        "single.txt", "corpus/a.txt", "corpus/b.txt", "corpus/sub/c.txt"]
    assert [s.name for s in skipped] == ["blob.bin"]
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        F.expand_inputs([tmp_path / "nope.txt"])


# -- loading tokenizers: errors that need no model --------------------------------------

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


# -- real tokenizers --------------------------------------------------------------------

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
    code = ("import sys; from ngramcache.tokenizers import load_tokenizer as L; t = L(sys.argv[1]); "
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


# -- Hugging Face tokenizer.json ---------------------------------------------------------

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


# -- progress ---------------------------------------------------------------------------

class _TTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_log_mode_is_quiet_for_short_tasks():
    s = io.StringIO()
    with Progress(100, "tokenizing", stream=s) as bar:
        bar.update(50)
        bar.update(50)
    assert s.getvalue() == ""


def test_progress_log_lines(monkeypatch):
    s = io.StringIO()
    monkeypatch.setattr(Progress, "LOG_INTERVAL", 0.0)
    with Progress(2_000_000, "counting", unit="tok", stream=s) as bar:
        bar.update(1_000_000)
    lines = s.getvalue().splitlines()
    assert "\r" not in s.getvalue()
    assert lines[0].startswith("counting:  50% [") and "ETA" in lines[0] and "1M tok / 2M tok" in lines[0]
    assert len(lines) == 2 and "done" not in lines[0]


def test_progress_tty_redraws_in_place(monkeypatch):
    s = _TTY()
    monkeypatch.setattr(Progress, "TTY_INTERVAL", 0.0)
    monkeypatch.delenv("TERM", raising=False)
    with Progress(10, "writing", unit="B", stream=s) as bar:
        for _ in range(10):
            bar.update(1)
    out = s.getvalue()
    assert out.count("\r") == 11 and out.endswith("\n") and "100%" in out and "done" in out


def test_progress_quiet_and_unknown_total(monkeypatch):
    s = _TTY()
    monkeypatch.setattr(Progress, "TTY_INTERVAL", 0.0)
    with Progress(10, "x", quiet=True, stream=s) as bar:
        bar.update(5)
    assert s.getvalue() == ""
    with Progress(None, "scan", unit="files", stream=s) as bar:
        bar.update(3)
    assert "scan: 3 files" in s.getvalue() and "ETA" not in s.getvalue()
    with pytest.raises(ValueError):
        Progress(-1, "x")


def test_formatting_and_rss():
    assert fmt_count(1234) == "1234" and fmt_count(1_234_567) == "1.23M" and fmt_count(250_000) == "250k"
    assert fmt_bytes(512) == "512 B" and fmt_bytes(1536) == "1.5 KiB" and fmt_bytes(3 * 2**30) == "3.0 GiB"
    assert fmt_seconds(0.5) == "0.50 s" and fmt_seconds(75) == "1:15" and fmt_seconds(3725) == "1:02:05"
    rss = peak_rss_bytes()
    assert 10 * 2**20 < rss < 64 * 2**30
    assert peak_rss_bytes(include_children=True) >= rss
    assert re.fullmatch(r"\d+", str(rss))
