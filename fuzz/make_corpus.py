"""Writes the seed corpus of every fuzz target into fuzz/corpus/<target>/ (small files:
valid ones made by the package itself, then truncated and bit-flipped variants).

    python fuzz/make_corpus.py

Deterministic: the same package writes the same seeds. A fuzzing run grows its own
working corpus elsewhere (fuzz/run.sh keeps it under build/fuzz/); what it finds worth
keeping is merged back with -merge=1 (docs/fuzzing.md), and this script leaves those
merged files alone.
"""

from __future__ import annotations

import io
import random
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import targets  # noqa: E402
from ngramcache import NgramCache, StaticTable  # noqa: E402
from ngramcache.serving.engine import Memory  # noqa: E402
from ngramcache.drafters.llama_ngram import NgramModTable  # noqa: E402
from ngramcache.drafters.suffix import SuffixStore  # noqa: E402

rng = random.Random(20261204)


def stream(n: int, vocab: int) -> np.ndarray:
    # Repetitive text-like tokens: phrases from a small vocabulary, so that keys repeat.
    phrases = [[rng.randrange(vocab) for _ in range(rng.randrange(2, 6))] for _ in range(6)]
    out: list[int] = []
    while len(out) < n:
        out += rng.choice(phrases)
    return np.array(out[:n], dtype=np.int32)


def variants(good: bytes) -> dict[str, bytes]:
    """A valid file, cut short in three places and with three single bits flipped."""
    out = {"valid": good}
    if good:
        for cut in sorted({len(good) // 3, len(good) // 2, len(good) - 1}):
            out[f"cut{cut}"] = good[:cut]
        for k in range(3):
            b = bytearray(good)
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
            out[f"flip{i}"] = bytes(b)
    return out


def lookup_seeds() -> dict[str, bytes]:
    seeds: dict[str, bytes] = {}
    for n_min, n_max, size in ((2, 2, 60), (1, 4, 40), (3, 3, 30)):
        c = NgramCache()
        c.update(stream(size, 12), n_min, n_max)
        for k, v in variants(c.to_bytes()).items():
            seeds[f"ngram{n_min}-{n_max}_{k}"] = v
    big = struct.pack("<4ii2i2i", 1, 2, -1, -1, 2, 5, 2**31 - 1, 6, 2**31 - 1)
    seeds["counts_at_int32_max"] = big
    seeds["duplicate_key"] = struct.pack("<4ii2i", 1, 2, -1, -1, 1, 3, 1) * 2
    seeds["empty"] = b""
    return seeds


def ngst_seeds() -> dict[str, bytes]:
    seeds: dict[str, bytes] = {}
    for n, size in ((2, 80), (1, 30), (3, 40), (4, 40)):
        t = StaticTable.build(stream(size, 10), n)
        for k, v in variants(t.to_bytes()).items():
            seeds[f"n{n}_{k}"] = v
    seeds["no_keys"] = StaticTable.build(np.zeros(0, np.int32), 2).to_bytes()
    c = NgramCache()
    c.update(stream(50, 8), 2, 2)
    seeds["from_llama"] = StaticTable.from_cache(c, 2).to_bytes()
    return seeds


def npy(arr, **kw) -> bytes:
    f = io.BytesIO()
    np.save(f, arr, **kw)
    return f.getvalue()


def tokens_file_seeds() -> dict[str, bytes]:
    toks = stream(20, 50)
    seeds = {
        "raw": toks.astype("<i4").tobytes(),
        "raw_empty": b"",
        "raw_odd_size": toks.astype("<i4").tobytes()[:-1],
        "raw_negative": np.array([1, -5, 3], "<i4").tobytes(),
        "npy_int64": npy(toks.astype(np.int64)),
        "npy_uint8": npy(toks.astype(np.uint8)),
        "npy_big_endian": npy(toks.astype(">i4")),
        "npy_float": npy(toks.astype(np.float32)),
        "npy_2d": npy(toks.reshape(4, 5)),
        "npy_fortran": npy(np.asfortranarray(toks.reshape(4, 5))),
        "npy_int64_beyond_int32": npy(np.array([1, 2**40], np.int64)),
        "npy_object": npy(np.array([1, "a"], dtype=object), allow_pickle=True),
        "npy_structured": npy(np.zeros(3, dtype=[("a", "<i4"), ("b", "<i2")])),
        "npy_empty": npy(np.zeros(0, np.int32)),
    }
    good = npy(toks)
    for k, v in variants(good).items():
        seeds[f"npy_{k}"] = v
    return seeds


def cache_files_seeds() -> dict[str, bytes]:
    seeds = {f"lookup_{k}": v for k, v in lookup_seeds().items() if not k.startswith("ngram3")}
    seeds.update({f"ngst_{k}": v for k, v in ngst_seeds().items() if k.startswith(("n2", "n3_valid", "no_keys"))})
    return seeds


def saved_state_seeds(tmp: Path) -> dict[str, bytes]:
    seeds: dict[str, bytes] = {}
    store = SuffixStore(max_tokens=200, max_depth=8)
    for _ in range(3):
        store.add(stream(15, 20))
    store.save(tmp / "store")
    mod = NgramModTable(64)
    from ngramcache.drafters.llama_ngram import NgramModDrafter

    NgramModDrafter(table=mod).reset(stream(40, 20))
    mod.save(tmp / "mod")
    mem = Memory(max_tokens=300, mod_size=32)
    for _ in range(3):
        mem.learn(stream(12, 30))
    mem.save(tmp / "mem", targets.MEMORY_VOCAB, targets.MEMORY_FINGERPRINT)
    for kind, name in (("suffix_store", "store"), ("ngram_mod", "mod"), ("server_memory", "mem")):
        good = (tmp / name).read_bytes()
        seeds[f"{kind}_valid"] = targets.state_input(kind, good)
        seeds[f"{kind}_as_saved"] = targets.state_input(kind, good, fix_crc=False)
        for k, v in variants(good).items():
            if k != "valid":
                seeds[f"{kind}_{k}"] = targets.state_input(kind, v, fix_crc=False)
    return seeds


def cli_seeds() -> dict[str, bytes]:
    argvs = {
        "info_ngst": ["info", "good.ngst", "--verify", "--json"],
        "info_lookup": ["info", "good.bin"],
        "info_fuzz": ["info", "fuzz.dat", "--verify"],
        "info_missing": ["info", "missing.bin"],
        "info_folder": ["info", "folder"],
        "convert_to_ngst": ["convert", "good.bin", "out.ngst", "--ngram-size", "2"],
        "convert_to_llama": ["convert", "good.ngst", "out.bin", "--format", "llama", "--json"],
        "convert_fuzz": ["convert", "fuzz.dat", "out.ngst"],
        "merge_two": ["merge", "good.bin", "good.ngst", "out.bin", "--json"],
        "merge_self": ["merge", "good.bin", "good.bin", "good.bin", "out.ngst"],
        "merge_fuzz": ["merge", "fuzz.dat", "good.bin", "out.bin", "-q"],
        "create_tokens": ["create", "--tokens", "tokens.i32", "-lcs", "out.ngst", "--json"],
        "create_npy": ["create", "--tokens", "tokens.npy", "-lcs", "out.bin", "--format", "llama"],
        "create_fuzz_tokens": ["create", "--tokens", "fuzz.dat", "-lcs", "out.bin", "-q"],
        "create_text": ["create", "-f", "text.txt", "folder", "-m", "x", "-lcs", "out.bin"],
        "create_conflict": ["create", "--tokens", "tokens.i32", "-f", "text.txt", "-lcs", "out.bin"],
        "stats_dynamic": ["stats", "--tokens", "tokens.i32", "-c", "4", "-lcd", "fuzz.dat", "--drafter", "lookup"],
        "stats_mod": ["stats", "--tokens", "tokens.i32", "-c", "3", "--drafter", "mod", "--spec-ngram-mod-n-match", "2"],
        "stats_tokens": ["stats", "--tokens", "tokens.i32", "-c", "4", "-lcs", "good.bin", "--json", "-q"],
        "stats_drafter": ["stats", "--tokens", "tokens.npy", "-c", "4", "--drafter", "suffix", "--suffix-min-prob", "0.5"],
        "stats_pld": ["stats", "--tokens", "fuzz.dat", "-c", "2", "--drafter", "pld", "--pld-match", "x"],
        "generate_prompt": ["generate", "-p", "a\\x41\\n\\u00e9", "-n", "4", "-lcs", "good.ngst"],
        "generate_file": ["generate", "-f", "text.txt", "-lcd", "fuzz.dat"],
        "demo_prompt": ["demo", "-p", "ab\\", "--repeats", "2"],
        "serve_flags": ["serve", "--port", "-1", "--memory", "fuzz.dat"],
        "chat_flags": ["chat", "-n", "0", "--temp", "nan"],
        "help": ["info", "-h"],
        "unknown_flag": ["merge", "--nope"],
    }
    good = NgramCache()
    good.update([1, 2, 3, 1, 2, 4], 1, 2)
    seeds = {}
    for name, argv in argvs.items():
        seeds[name] = targets.cli_input(argv, good.to_bytes() if "fuzz" in name else b"")
    return seeds


def cost_store_seeds() -> dict[str, bytes]:
    k = targets.COST_KEY
    return {
        "valid": b'{"' + k + b'": [0.01, 0.012, 0.015]}',
        "other_key": b'{"v2|/m.gguf|1|2|t2|tb2": [0.5]}',
        "two_keys": b'{"' + k + b'": [0.5, 1.0], "x": [1]}',
        "not_a_dict": b"[1, 2]",
        "element_list": b'{"' + k + b'": [0.1, [0.2]]}',
        "element_text": b'{"' + k + b'": ["0.5"]}',
        "negative": b'{"' + k + b'": [-1, 2]}',
        "huge": b'{"' + k + b'": [1e400]}',
        "cut": b'{"' + k + b'": [0.01, 0.0',
        "not_utf8": b'\xff\xfe{"' + k + b'": [1]}',
        "empty": b"",
    }


def write(target: str, seeds: dict[str, bytes]) -> None:
    # Only the seeds are rewritten: the inputs merged in from fuzzing runs stay.
    folder = HERE / "corpus" / target
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in seeds.items():
        (folder / name).write_bytes(data)
    print(f"{target}: {len(seeds)} files, {sum(map(len, seeds.values()))} bytes")


def main() -> None:
    tmp = targets.scratch()
    write("lookup", lookup_seeds())
    write("ngst", ngst_seeds())
    write("tokens_file", tokens_file_seeds())
    write("cache_files", cache_files_seeds())
    write("saved_state", saved_state_seeds(tmp))
    write("cost_store", cost_store_seeds())
    write("cli", cli_seeds())


if __name__ == "__main__":
    main()
