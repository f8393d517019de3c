"""Golden outputs of the command line: what every command prints, its exit status and the
bytes of the files it writes, compared with the expected files in tests/golden/.

Each case runs ``ngramcache.cli.main.main(argv)`` in this process, in a fresh directory holding
the inputs (so every path on the command line is relative), and compares the result with
``tests/golden/<case>.txt``. Only what legitimately varies between runs and machines is
normalised before the comparison:

* timings (seconds, ms, us, tokens per second) and peak memory, in the tables and in --json;
* the absolute path of the run's directory, written as ``<tmp>``;
* progress lines on stderr (printed only when a stage runs longer than a few seconds);
* a usage message is cut to its first line (the rest is help text, wrapped to the terminal;
  argparse's width is pinned to 80 columns so that line is stable), and ``--help`` to the
  first line of the usage.

Everything else (counts, labels, column layout, ordering, the stderr lines, the exit
status, the sha256 of every file written) must match exactly.

To rewrite the expected files from the code installed in the running interpreter:

    NGRAMCACHE_UPDATE_GOLDEN=1 python -m pytest tests/test_cli_golden.py -p no:cacheprovider

and review the diff: the expected files record the command line's behaviour, so a change
there is a change users see.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("NGRAMCACHE_UPDATE_GOLDEN") == "1"

# -- inputs -------------------------------------------------------------------------------

# Reference vectors copied into every case's directory under their own names.
VECTOR_FILES = ("prose.tokens.i32", "dynpub.tokens.i32", "small-static.tokens.i32", "prose.context.bin",
                "dynpub.context.bin", "static-small.lcs.bin")


def _derive_inputs(d: Path) -> None:
    """The inputs made from the reference vectors: static tables, short and broken files."""
    from ngramcache import StaticTable

    prose = np.fromfile(d / "prose.tokens.i32", dtype="<i4")
    small = np.fromfile(d / "small-static.tokens.i32", dtype="<i4")
    StaticTable.build(small, ngram_size=2).save(str(d / "small-static.ngst"))
    StaticTable.build(prose, ngram_size=2).save(str(d / "prose.ngst"))
    np.save(d / "prose.npy", prose)
    prose[:100].astype("<i4").tofile(d / "short.tokens.i32")
    prose[:1024].astype("<i4").tofile(d / "exact1024.tokens.i32")
    prose[:2].astype("<i4").tofile(d / "tiny.tokens.i32")
    (d / "empty.tokens.i32").write_bytes(b"")
    (d / "odd.tokens.i32").write_bytes(b"\x01\x00\x00\x00\x02\x00\x00")
    np.array([5, 7, -3, 9], dtype="<i4").tofile(d / "negative.tokens.i32")

    ngst = (d / "small-static.ngst").read_bytes()
    (d / "truncated.ngst").write_bytes(ngst[:1000])
    corrupt = bytearray(ngst)
    corrupt[len(corrupt) - 10] ^= 0xFF  # inside the last section: only --verify can tell
    (d / "corrupt.ngst").write_bytes(bytes(corrupt))
    (d / "empty.ngst").write_bytes(b"")
    lcs = (d / "static-small.lcs.bin").read_bytes()
    (d / "truncated.bin").write_bytes(lcs[:1001])
    (d / "garbage.bin").write_bytes(b"not a cache\n")
    (d / "empty.bin").write_bytes(b"")
    (d / "prompt.txt").write_bytes(b"hello\n")


@pytest.fixture(scope="session")
def inputs_dir(tmp_path_factory, vectors_dir: Path) -> Path:
    d = tmp_path_factory.mktemp("golden-inputs")
    for name in VECTOR_FILES:
        shutil.copyfile(vectors_dir / name, d / name)
    _derive_inputs(d)
    for p in d.iterdir():
        p.chmod(0o444)  # shared by every case (hard links): nothing may write into them
    return d


def _populate(work: Path, inputs: Path) -> None:
    for src in inputs.iterdir():
        try:
            os.link(src, work / src.name)
        except OSError:
            shutil.copyfile(src, work / src.name)


def _snapshot(work: Path) -> dict[str, tuple]:
    return {str(p.relative_to(work)): (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(work.rglob("*")) if p.is_file()}


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()  # the files a golden run writes are small


# -- cases --------------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    argv: list[str]
    setup: Callable[[Path], None] | None = None
    help: bool = False  # --help: only the exit status and the usage's first line are pinned
    hash_files: bool = True  # False for files whose bytes come from another library (PNG)
    needs: tuple[str, ...] = field(default_factory=tuple)  # optional modules
    broken_stdout: bool = False  # stdout closed by its reader (piped into head)


def _mkdir(name: str) -> Callable[[Path], None]:
    return lambda work: (work / name).mkdir()


T_SMALL = "small-static.tokens.i32"
T_PROSE = "prose.tokens.i32"

CASES = [
    # top level
    Case("top_no_command", [], help=True),
    Case("top_help", ["--help"], help=True),
    Case("top_unknown_command", ["frobnicate"]),

    # create
    Case("create_ngst", ["create", "--tokens", T_SMALL, "-lcs", "out.ngst"]),
    Case("create_ngst_json", ["create", "--tokens", T_SMALL, "-lcs", "out.ngst", "--json"]),
    Case("create_bin", ["create", "--tokens", T_SMALL, "-lcs", "out.bin"]),
    Case("create_bin_json", ["create", "--tokens", T_SMALL, "-lcs", "out.bin", "--json"]),
    Case("create_lcs_ext", ["create", "--tokens", T_PROSE, "-lcs", "out.lcs", "-q"]),
    Case("create_lcd_ext_json", ["create", "--tokens", T_PROSE, "-lcs", "out.lcd", "--json"]),
    Case("create_format_llama", ["create", "--tokens", T_SMALL, "-lcs", "out.cache", "--format", "llama"]),
    Case("create_format_ngst", ["create", "--tokens", T_SMALL, "-lcs", "out.cache", "--format", "ngst"]),
    Case("create_format_overrides_ext", ["create", "--tokens", T_SMALL, "-lcs", "out.ngst", "--format", "llama"]),
    Case("create_long_flag", ["create", "--tokens", T_PROSE, "--lookup-cache-static", "prose-out.ngst", "--quiet"]),
    Case("create_npy_json", ["create", "--tokens", "prose.npy", "-lcs", "out.ngst", "--json"]),
    Case("create_npy_bin", ["create", "--tokens", "prose.npy", "-lcs", "out.bin"]),
    Case("create_tiny_ngst", ["create", "--tokens", "tiny.tokens.i32", "-lcs", "out.ngst"]),
    Case("create_tiny_bin_json", ["create", "--tokens", "tiny.tokens.i32", "-lcs", "out.bin", "--json"]),
    Case("create_empty_quiet", ["create", "--tokens", "empty.tokens.i32", "-lcs", "out.bin", "-q"]),
    Case("create_help", ["create", "--help"], help=True),
    Case("create_no_input", ["create", "-lcs", "out.ngst"]),
    Case("create_no_lcs", ["create", "--tokens", T_SMALL]),
    Case("create_tokens_and_file", ["create", "--tokens", T_SMALL, "-f", "prompt.txt", "-lcs", "out.ngst"]),
    Case("create_file_without_tokenizer", ["create", "-f", "prompt.txt", "-lcs", "out.ngst"]),
    Case("create_missing_tokens", ["create", "--tokens", "missing.tokens.i32", "-lcs", "out.ngst"]),
    Case("create_odd_tokens", ["create", "--tokens", "odd.tokens.i32", "-lcs", "out.ngst"]),
    Case("create_negative_tokens", ["create", "--tokens", "negative.tokens.i32", "-lcs", "out.bin"]),
    Case("create_tokens_is_dir", ["create", "--tokens", "adir", "-lcs", "out.ngst"], setup=_mkdir("adir")),
    Case("create_bad_ext", ["create", "--tokens", T_SMALL, "-lcs", "out.txt"]),
    Case("create_no_ext", ["create", "--tokens", T_SMALL, "-lcs", "out"]),
    Case("create_bad_format", ["create", "--tokens", T_SMALL, "-lcs", "out.ngst", "--format", "json"]),
    Case("create_missing_dir", ["create", "--tokens", T_SMALL, "-lcs", "nodir/out.ngst"]),
    Case("create_output_is_dir", ["create", "--tokens", T_SMALL, "-lcs", "adir.ngst"], setup=_mkdir("adir.ngst")),
    Case("create_overwrite_input", ["create", "--tokens", T_SMALL, "-lcs", T_SMALL, "--format", "llama"]),
    Case("create_jobs_zero", ["create", "--tokens", T_SMALL, "-lcs", "out.ngst", "-j", "0"]),
    Case("create_jobs_not_int", ["create", "--tokens", T_SMALL, "-lcs", "out.ngst", "-j", "two"]),
    Case("create_stdout_closed", ["create", "--tokens", T_SMALL, "-lcs", "out.ngst"], broken_stdout=True),
    Case("create_piece_size_negative", ["create", "--tokens", T_SMALL, "-lcs", "out.ngst", "--piece-size", "-1"]),

    # merge
    Case("merge_bin_ngst_to_bin", ["merge", "static-small.lcs.bin", "prose.ngst", "out.bin"]),
    Case("merge_bin_ngst_to_bin_json", ["merge", "static-small.lcs.bin", "prose.ngst", "out.bin", "--json"]),
    Case("merge_bin_ngst_to_ngst", ["merge", "static-small.lcs.bin", "prose.ngst", "out.ngst"]),
    Case("merge_bin_ngst_to_ngst_json", ["merge", "static-small.lcs.bin", "prose.ngst", "out.ngst", "--json"]),
    Case("merge_contexts", ["merge", "prose.context.bin", "dynpub.context.bin", "out.bin"]),
    Case("merge_contexts_json", ["merge", "prose.context.bin", "dynpub.context.bin", "out.bin", "--json", "-q"]),
    Case("merge_three", ["merge", "small-static.ngst", "prose.ngst", "empty.bin", "out.ngst", "--json"]),
    Case("merge_single_converts", ["merge", "static-small.lcs.bin", "out.ngst"]),
    Case("merge_format_llama", ["merge", "small-static.ngst", "prose.ngst", "out.cache", "--format", "llama"]),
    Case("merge_contexts_to_ngst", ["merge", "prose.context.bin", "dynpub.context.bin", "out.ngst"]),
    Case("merge_stdout_closed", ["merge", "static-small.lcs.bin", "prose.ngst", "out.bin", "--json"],
         broken_stdout=True),
    Case("merge_help", ["merge", "--help"], help=True),
    Case("merge_no_args", ["merge"]),
    Case("merge_one_path", ["merge", "out.bin"]),
    Case("merge_overwrite_input", ["merge", "static-small.lcs.bin", "prose.context.bin", "static-small.lcs.bin"]),
    Case("merge_missing_input", ["merge", "missing.bin", "static-small.lcs.bin", "out.bin"]),
    Case("merge_damaged_bin", ["merge", "static-small.lcs.bin", "truncated.bin", "out.bin"]),
    Case("merge_garbage_bin", ["merge", "garbage.bin", "static-small.lcs.bin", "out.bin"]),
    Case("merge_damaged_ngst", ["merge", "truncated.ngst", "static-small.lcs.bin", "out.bin"]),
    Case("merge_empty_ngst", ["merge", "empty.ngst", "static-small.lcs.bin", "out.bin"]),
    Case("merge_input_is_dir", ["merge", "adir", "static-small.lcs.bin", "out.bin"], setup=_mkdir("adir")),
    Case("merge_missing_dir", ["merge", "static-small.lcs.bin", "prose.ngst", "nodir/out.bin"]),
    Case("merge_bad_ext", ["merge", "static-small.lcs.bin", "prose.ngst", "out.txt"]),

    # convert
    Case("convert_bin_to_ngst", ["convert", "static-small.lcs.bin", "out.ngst"]),
    Case("convert_bin_to_ngst_json", ["convert", "static-small.lcs.bin", "out.ngst", "--json"]),
    Case("convert_ngst_to_bin", ["convert", "small-static.ngst", "out.bin"]),
    Case("convert_ngst_to_bin_json", ["convert", "small-static.ngst", "out.bin", "--json"]),
    Case("convert_bin_to_bin", ["convert", "static-small.lcs.bin", "out.bin"]),
    Case("convert_ngst_to_ngst", ["convert", "prose.ngst", "out.ngst", "--json"]),
    Case("convert_format_ngst", ["convert", "static-small.lcs.bin", "out.cache", "--format", "ngst"]),
    Case("convert_context_ngram_size_1", ["convert", "prose.context.bin", "out.ngst", "--ngram-size", "1"]),
    Case("convert_context_ngram_size_3_json", ["convert", "prose.context.bin", "out.ngst", "--ngram-size", "3",
                                               "--json"]),
    Case("convert_context_ngram_size_4", ["convert", "prose.context.bin", "out.ngst", "--ngram-size", "4"]),
    Case("convert_static_ngram_size_2", ["convert", "static-small.lcs.bin", "out.ngst", "--ngram-size", "2"]),
    Case("convert_stdout_closed", ["convert", "static-small.lcs.bin", "out.ngst"], broken_stdout=True),
    Case("convert_help", ["convert", "--help"], help=True),
    Case("convert_context_no_ngram_size", ["convert", "prose.context.bin", "out.ngst"]),
    Case("convert_ngram_size_wrong_direction", ["convert", "small-static.ngst", "out.bin", "--ngram-size", "2"]),
    Case("convert_ngram_size_5", ["convert", "prose.context.bin", "out.ngst", "--ngram-size", "5"]),
    Case("convert_one_path", ["convert", "static-small.lcs.bin"]),
    Case("convert_missing_input", ["convert", "missing.bin", "out.ngst"]),
    Case("convert_garbage_bin", ["convert", "garbage.bin", "out.ngst"]),
    Case("convert_damaged_bin", ["convert", "truncated.bin", "out.bin"]),
    Case("convert_damaged_ngst", ["convert", "truncated.ngst", "out.bin"]),
    Case("convert_input_is_dir", ["convert", "adir", "out.bin"], setup=_mkdir("adir")),
    Case("convert_overwrite_input", ["convert", "static-small.lcs.bin", "static-small.lcs.bin"]),
    Case("convert_missing_dir", ["convert", "static-small.lcs.bin", "nodir/out.ngst"]),
    Case("convert_bad_ext", ["convert", "static-small.lcs.bin", "out.dat"]),

    # info
    Case("info_ngst", ["info", "small-static.ngst"]),
    Case("info_ngst_verify", ["info", "small-static.ngst", "--verify"]),
    Case("info_ngst_json", ["info", "small-static.ngst", "--json"]),
    Case("info_ngst_verify_json", ["info", "prose.ngst", "--verify", "--json"]),
    Case("info_bin", ["info", "static-small.lcs.bin"]),
    Case("info_bin_verify", ["info", "static-small.lcs.bin", "--verify"]),
    Case("info_bin_json", ["info", "static-small.lcs.bin", "--json"]),
    Case("info_context_bin", ["info", "prose.context.bin"]),
    Case("info_context_bin_json", ["info", "dynpub.context.bin", "--json"]),
    Case("info_empty_bin", ["info", "empty.bin"]),
    Case("info_empty_bin_json", ["info", "empty.bin", "--json"]),
    Case("info_corrupt_ngst", ["info", "corrupt.ngst"]),
    Case("info_stdout_closed", ["info", "small-static.ngst"], broken_stdout=True),
    Case("info_json_stdout_closed", ["info", "static-small.lcs.bin", "--json"], broken_stdout=True),
    Case("info_help", ["info", "--help"], help=True),
    Case("info_no_args", ["info"]),
    Case("info_corrupt_ngst_verify", ["info", "corrupt.ngst", "--verify"]),
    Case("info_missing", ["info", "missing.ngst"]),
    Case("info_truncated_ngst", ["info", "truncated.ngst"]),
    Case("info_empty_ngst", ["info", "empty.ngst"]),
    Case("info_truncated_bin", ["info", "truncated.bin"]),
    Case("info_garbage_bin", ["info", "garbage.bin", "--json"]),
    Case("info_dir", ["info", "adir"], setup=_mkdir("adir")),

    # stats
    Case("stats_n3", ["stats", "--tokens", T_PROSE, "-c", "512", "--spec-draft-n-max", "3"]),
    Case("stats_n8", ["stats", "--tokens", T_PROSE, "-c", "512", "--spec-draft-n-max", "8"]),
    Case("stats_n3_json", ["stats", "--tokens", T_PROSE, "-c", "512", "--spec-draft-n-max", "3", "--json"]),
    Case("stats_defaults", ["stats", "--tokens", T_PROSE]),
    Case("stats_n0", ["stats", "--tokens", T_PROSE, "-c", "512", "--spec-draft-n-max", "0"]),
    Case("stats_n0_json", ["stats", "--tokens", T_PROSE, "-c", "2048", "--spec-draft-n-max", "0", "--json"]),
    Case("stats_npy", ["stats", "--tokens", "prose.npy", "-c", "1024", "--spec-draft-n-max", "5"]),
    Case("stats_lcs_ngst_n3", ["stats", "--tokens", T_PROSE, "-c", "512", "--spec-draft-n-max", "3",
                               "-lcs", "small-static.ngst"]),
    Case("stats_lcs_ngst_n8", ["stats", "--tokens", T_PROSE, "-c", "512", "--spec-draft-n-max", "8",
                               "-lcs", "small-static.ngst"]),
    Case("stats_lcs_bin_n3", ["stats", "--tokens", T_PROSE, "-c", "512", "--spec-draft-n-max", "3",
                              "-lcs", "static-small.lcs.bin"]),
    Case("stats_lcs_bin_n8", ["stats", "--tokens", T_PROSE, "-c", "512", "--spec-draft-n-max", "8",
                              "-lcs", "static-small.lcs.bin"]),
    Case("stats_lcs_ngst_json", ["stats", "--tokens", T_PROSE, "-c", "512", "--spec-draft-n-max", "8",
                                 "-lcs", "small-static.ngst", "--json"]),
    Case("stats_lcs_bin_json", ["stats", "--tokens", T_PROSE, "-c", "512", "--spec-draft-n-max", "3",
                                "--lookup-cache-static", "static-small.lcs.bin", "--json"]),
    Case("stats_lcd_n3", ["stats", "--tokens", T_PROSE, "-c", "512", "--spec-draft-n-max", "3",
                          "-lcd", "dynpub.context.bin"]),
    Case("stats_lcd_n8", ["stats", "--tokens", T_PROSE, "-c", "512", "--spec-draft-n-max", "8",
                          "-lcd", "dynpub.context.bin"]),
    Case("stats_lcs_lcd_n8", ["stats", "--tokens", T_PROSE, "-c", "512", "--spec-draft-n-max", "8",
                              "-lcs", "small-static.ngst", "-lcd", "dynpub.context.bin"]),
    Case("stats_lcs_lcd_json", ["stats", "--tokens", T_PROSE, "-c", "512", "--spec-draft-n-max", "3",
                                "-lcs", "static-small.lcs.bin", "--lookup-cache-dynamic", "dynpub.context.bin",
                                "--json"]),
    Case("stats_lcd_empty_bin", ["stats", "--tokens", T_PROSE, "-c", "4096", "-lcd", "empty.bin"]),
    Case("stats_lcd_missing", ["stats", "--tokens", T_PROSE, "-c", "4096", "-lcd", "missing.bin"]),
    Case("stats_lcd_missing_quiet", ["stats", "--tokens", T_PROSE, "-c", "4096", "-lcd", "missing.bin", "-q"]),
    Case("stats_exact_multiple", ["stats", "--tokens", "exact1024.tokens.i32", "-c", "512",
                                  "--spec-draft-n-max", "4"]),
    Case("stats_c2", ["stats", "--tokens", "short.tokens.i32", "-c", "2", "--spec-draft-n-max", "2", "--json"]),
    Case("stats_tokens_with_model", ["stats", "--tokens", "short.tokens.i32", "-c", "64", "-m", "model.gguf"]),
    Case("stats_plot", ["stats", "--tokens", T_PROSE, "-c", "4096", "--plot", "accept.png"],
         hash_files=False, needs=("matplotlib",)),
    Case("stats_plot_missing_dir", ["stats", "--tokens", T_PROSE, "-c", "4096", "--plot", "nodir/accept.png"],
         needs=("matplotlib",)),
    Case("stats_help", ["stats", "--help"], help=True),
    Case("stats_c1", ["stats", "--tokens", T_PROSE, "-c", "1"]),
    Case("stats_c0", ["stats", "--tokens", T_PROSE, "-c", "0"]),
    Case("stats_c_not_int", ["stats", "--tokens", T_PROSE, "-c", "big"]),
    Case("stats_n_negative", ["stats", "--tokens", T_PROSE, "-c", "512", "--spec-draft-n-max", "-1"]),
    Case("stats_no_input", ["stats", "-c", "512"]),
    Case("stats_tokens_and_file", ["stats", "--tokens", T_PROSE, "-f", "prompt.txt"]),
    Case("stats_file_without_tokenizer", ["stats", "-f", "prompt.txt"]),
    Case("stats_missing_tokens", ["stats", "--tokens", "missing.tokens.i32"]),
    Case("stats_odd_tokens", ["stats", "--tokens", "odd.tokens.i32"]),
    Case("stats_negative_tokens", ["stats", "--tokens", "negative.tokens.i32", "-c", "2"]),
    Case("stats_too_short", ["stats", "--tokens", "short.tokens.i32", "-c", "512"]),
    Case("stats_too_short_equal", ["stats", "--tokens", "exact1024.tokens.i32", "-c", "1024"]),
    Case("stats_empty_tokens", ["stats", "--tokens", "empty.tokens.i32", "-c", "2"]),
    Case("stats_lcs_missing", ["stats", "--tokens", T_PROSE, "-c", "512", "-lcs", "missing.ngst"]),
    Case("stats_lcs_truncated_ngst", ["stats", "--tokens", T_PROSE, "-c", "512", "-lcs", "truncated.ngst"]),
    Case("stats_lcs_truncated_bin", ["stats", "--tokens", T_PROSE, "-c", "512", "-lcs", "truncated.bin"]),
    Case("stats_lcs_garbage_bin", ["stats", "--tokens", T_PROSE, "-c", "512", "-lcs", "garbage.bin"]),
    Case("stats_lcs_context_bin", ["stats", "--tokens", T_PROSE, "-c", "512", "-lcs", "prose.context.bin"]),
    Case("stats_lcd_truncated", ["stats", "--tokens", T_PROSE, "-c", "512", "-lcd", "truncated.bin"]),
    Case("stats_lcd_ngst", ["stats", "--tokens", T_PROSE, "-c", "512", "-lcd", "small-static.ngst"]),

    # generate and demo: only what is decided before a model is needed
    Case("generate_help", ["generate", "--help"], help=True),
    Case("generate_no_prompt", ["generate"]),
    Case("generate_prompt_and_file", ["generate", "-p", "hi", "-f", "prompt.txt"]),
    Case("generate_n_draft_negative", ["generate", "-p", "hi", "--spec-draft-n-max", "-1"]),
    Case("generate_n_predict_too_small", ["generate", "-p", "hi", "-n", "-2"]),
    Case("generate_ctx_too_small", ["generate", "-p", "hi", "-c", "4"]),
    Case("generate_batch_zero", ["generate", "-p", "hi", "-b", "0"]),
    Case("generate_threads_zero", ["generate", "-p", "hi", "-t", "0"]),
    Case("generate_temp_negative", ["generate", "-p", "hi", "--temp", "-0.5"]),
    Case("demo_help", ["demo", "--help"], help=True),
    Case("demo_n_zero", ["demo", "-n", "0"]),
    Case("demo_repeats_zero", ["demo", "--repeats", "0"]),
    Case("demo_n_draft_zero", ["demo", "--spec-draft-n-max", "0"]),
    Case("demo_threads_zero", ["demo", "-t", "0"]),
    Case("demo_prompt_and_file", ["demo", "-p", "hi", "-f", "prompt.txt"]),
]

# -- normalisation ------------------------------------------------------------------------

NUM = r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?"  # in text: thousands separated by commas
JSON_NUM = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
DURATION = re.compile(r"\d+(?:\.\d+)? s\b|\b\d+:\d\d(?::\d\d)?\b")
BYTES = re.compile(r"\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB|PiB)\b")
TIMING_NUMBER = re.compile(NUM + r"|\bnan\b|\binf\b")

# JSON keys whose values are timings or rates, and memory peaks.
JSON_TIMES = ("seconds", "t_draft_flat", "t_draft", "t_replay", "static_load_s", "dynamic_load_s",
              "us_per_drafted", "replay_tokens_per_s")
JSON_TIME_VALUE = re.compile(r'("(?:' + "|".join(JSON_TIMES) + r')": )' + JSON_NUM)
JSON_PEAK_VALUE = re.compile(r'("peak_rss_bytes": )' + JSON_NUM)
JSON_STAGES = re.compile(r'("stage_seconds": \{)([^}]*)(\})')
JSON_ANY_NUMBER = re.compile(r"(: )" + JSON_NUM)

PROGRESS_LINE = re.compile(r"^[\w .-]+: .*\S/s  ")


def _text_line(line: str) -> str:
    """Timings and memory in one line of a command's table or summary."""
    s = line.lstrip()
    if re.match(r"time\s{2,}", s):  # the cache commands' "time  0.03 s (read 0.00 s, ...)"
        return DURATION.sub("<time>", line)
    if re.match(r"(peak memory|peak RSS)\s{2,}", s):
        return BYTES.sub("<bytes>", line)
    if line.startswith(("t_draft_flat =", "t_draft      =")):
        head, _, rest = line.partition("=")
        return head + "=" + TIMING_NUMBER.sub("<time>", rest)
    if re.match(r"(draft time per drafted|replay wall time|static load \(|dynamic load)", s):
        m = re.match(r"(\S.*?\s{2,})(.*)", s)
        if m:
            return line[: len(line) - len(s)] + m.group(1) + TIMING_NUMBER.sub("<time>", m.group(2))
    return line


def _json_text(text: str) -> str:
    text = JSON_STAGES.sub(lambda m: m.group(1) + JSON_ANY_NUMBER.sub(r"\1<time>", m.group(2)) + m.group(3), text)
    text = JSON_TIME_VALUE.sub(r"\1<time>", text)
    return JSON_PEAK_VALUE.sub(r"\1<bytes>", text)


def _cut_usage(lines: list[str]) -> list[str]:
    """A usage message keeps its first line; its wrapped continuation lines go."""
    out, in_usage = [], False
    for line in lines:
        if line.startswith("usage: "):
            in_usage = True
            out.append(line)
            continue
        if in_usage and line.startswith(" "):
            continue
        in_usage = False
        out.append(line)
    return out


def _paths(text: str, work: Path) -> str:
    for p in sorted({str(work), os.path.realpath(work)}, key=len, reverse=True):
        text = text.replace(p, "<tmp>")
    return text


def normalise_stdout(text: str, work: Path, case: Case) -> str:
    text = _paths(text, work)
    if case.help:
        return text.splitlines(keepends=True)[0] if text else text
    text = _json_text(text)
    lines = _cut_usage(text.split("\n"))
    return "\n".join(_text_line(line) for line in lines)


def normalise_stderr(text: str, work: Path) -> str:
    text = _paths(text, work)
    lines = [line for line in text.split("\n") if not PROGRESS_LINE.match(line)]
    return "\n".join(_cut_usage(lines))


# -- running ------------------------------------------------------------------------------

def _block(title: str, text: str) -> list[str]:
    lines = [f"--- {title}"]
    if text:
        lines += text.split("\n")
        if text.endswith("\n"):
            lines.pop()  # the final newline is the normal case ...
        else:
            lines.append("\\ no newline at end")  # ... its absence is marked, as diff does
    return lines


class _ClosedStdout:
    """stdout whose reader went away: every write fails as it does on a closed pipe."""

    def write(self, s):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")

    def isatty(self):
        return False


def run_case(case: Case, inputs: Path, work: Path, capsys, monkeypatch) -> str:
    from ngramcache import cli

    _populate(work, inputs)
    if case.setup is not None:
        case.setup(work)
    before = _snapshot(work)
    monkeypatch.chdir(work)
    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps its usage to the terminal's width
    capsys.readouterr()
    closed = _ClosedStdout()
    if case.broken_stdout:
        monkeypatch.setattr(sys, "stdout", closed)
    outcome: str
    try:
        rc = cli.main(list(case.argv))
        outcome = f"exit status: {rc}"
    except SystemExit as e:  # argparse's own exits
        if e.code is None or isinstance(e.code, int):
            outcome = f"exit status: {e.code or 0}"
        else:
            outcome = f"exit status: 1, message {e.code!r}"
    finally:
        if case.broken_stdout and sys.stdout not in (closed, sys.__stdout__):
            sys.stdout.close()  # what the command opened in its place (os.devnull)
            sys.stdout = closed
    captured = capsys.readouterr()

    stdout = normalise_stdout(captured.out, work, case)
    stderr = normalise_stderr(captured.err, work)
    if "--json" in case.argv and outcome == "exit status: 0" and not case.broken_stdout:
        json.loads(captured.out)  # one well-formed JSON document, before any placeholder went in

    after = _snapshot(work)
    files = []
    for name, meta in after.items():
        if before.get(name) == meta:
            continue
        p = work / name
        tag = "" if name not in before else "  (an input, rewritten)"
        if case.hash_files:
            files.append(f"{name}  {p.stat().st_size} bytes  sha256 {_sha256(p)}{tag}")
        else:
            files.append(f"{name}  written{tag}")
    for name in before:
        if name not in after:
            files.append(f"{name}  (an input, removed)")

    lines = [f"$ ngramcache {' '.join(case.argv)}".rstrip(), outcome]
    lines += _block("stdout (closed by its reader)" if case.broken_stdout else "stdout", stdout)
    lines += _block("stderr", stderr)
    lines += ["--- files written"] + files
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cli_golden(case: Case, inputs_dir: Path, tmp_path: Path, capsys, monkeypatch):
    for mod in case.needs:
        pytest.importorskip(mod)
    work = tmp_path / "work"
    work.mkdir()
    actual = run_case(case, inputs_dir, work, capsys, monkeypatch)
    path = GOLDEN / f"{case.name}.txt"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(actual, encoding="utf-8")
        return
    if not path.is_file():
        pytest.fail(f"no expected output {path}; write it with NGRAMCACHE_UPDATE_GOLDEN=1 from the reference code")
    expected = path.read_text(encoding="utf-8")
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                                            fromfile=f"expected {path.name}", tofile="actual"))
        pytest.fail(f"the output of `ngramcache {' '.join(case.argv)}` changed:\n{diff}", pytrace=False)


def test_no_stale_golden_files():
    """Every expected file belongs to a case (a renamed or removed case leaves none behind)."""
    names = {c.name for c in CASES}
    assert len(names) == len(CASES), "two cases share a name"
    stale = sorted(p.name for p in GOLDEN.glob("*.txt") if p.stem not in names)
    assert not stale, f"expected files without a case: {stale}"


def test_normalisation_keeps_what_is_pinned(tmp_path: Path):
    """The placeholders replace timings, memory and the run's path, and nothing else."""
    case = Case("n", [])
    table = ("create: done\n  tokens       248,752\n  output       out.ngst (ngst, 2.7 MiB)\n"
             "  time         0.03 s (read 0.00 s, count 0.02 s, write 12.5 s)\n  peak memory  39.8 MiB\n")
    assert normalise_stdout(table, tmp_path, case) == (
        "create: done\n  tokens       248,752\n  output       out.ngst (ngst, 2.7 MiB)\n"
        "  time         <time> (read <time>, count <time>, write <time>)\n  peak memory  <bytes>\n")
    summary = ("t_draft_flat = 27.77 ms\nt_draft      = 89.77 ms, 1.36 us per token, 735432.73 tokens per second\n"
               "n_accept     = 10550\n  replay wall time            0.122 s (489,051 tokens/s)\n"
               "  static load (static table)  0.092 ms\n  draft time per drafted      nan us\n"
               "  peak RSS                    59.3 MiB\n")
    assert normalise_stdout(summary, tmp_path, case) == (
        "t_draft_flat = <time> ms\nt_draft      = <time> ms, <time> us per token, <time> tokens per second\n"
        "n_accept     = 10550\n  replay wall time            <time> s (<time> tokens/s)\n"
        "  static load (static table)  <time> ms\n  draft time per drafted      <time> us\n"
        "  peak RSS                    <bytes>\n")
    js = ('{"keys": 5, "seconds": 0.0285, "stage_seconds": {"read": 0.0012, "write": 1e-05}, '
          f'"output": "{tmp_path}/o.bin", "t_draft": 0.04, "static_load_s": null, "peak_rss_bytes": 41738240, "n": 1}}')
    assert normalise_stdout(js, tmp_path, case) == (
        '{"keys": 5, "seconds": <time>, "stage_seconds": {"read": <time>, "write": <time>}, '
        '"output": "<tmp>/o.bin", "t_draft": <time>, "static_load_s": null, "peak_rss_bytes": <bytes>, "n": 1}')
    err = "usage: ngramcache x [-h]\n                    [--y Y]\nngramcache x: error: bad\n"
    assert normalise_stderr(err, tmp_path) == "usage: ngramcache x [-h]\nngramcache x: error: bad\n"
    assert normalise_stderr("replay: 50% [###---] 1 / 2 tok  9 tok/s  5.00 s  ETA 5.00 s\nnote\n",
                            tmp_path) == "note\n"
