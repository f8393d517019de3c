"""ngramcache.corpus.text: llama.cpp's -f text rules (one trailing newline dropped, then escapes),
the check for code points above U+10FFFF with its byte offset, and split_pieces."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import _stdlib_text
import ngramcache.corpus.text as TX


# An independent transcription of llama.cpp's string_process_escapes (common.cpp), byte by
# byte, with strtol's rules for the two characters after "\x".

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


# --- escapes and the trailing newline --------------------------------------------------

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


# --- invalid code points ---------------------------------------------------------------

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


# --- pieces ----------------------------------------------------------------------------

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


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs Linux's /proc/self/mem")
def test_a_failed_read_names_the_file():
    # /proc/self/mem opens but cannot be read at offset 0: the OS's error has no file name
    with pytest.raises(OSError) as e:
        TX.read_input("/proc/self/mem")
    assert e.value.filename == "/proc/self/mem" and e.value.errno == 5
    with pytest.raises(OSError, match="/proc/self/mem"):
        TX.read_text_file("/proc/self/mem")


def test_read_input_whole_or_a_head(tmp_path):
    p = tmp_path / "a.txt"
    p.write_bytes(b"hello\n")
    assert TX.read_input(p) == b"hello\n" and TX.read_input(p, 1) == b"h"
    with pytest.raises(FileNotFoundError) as e:
        TX.read_input(tmp_path / "missing.txt")
    assert e.value.filename == str(tmp_path / "missing.txt")
