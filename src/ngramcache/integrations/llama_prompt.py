"""The prompt through repacked weights, the tokens after it through the exact ones.

Weight repacking (llama.cpp's CPU "extra buffer types") makes the prompt pass of models with
Q4_0, Q4_K or IQ4_NL weights much faster, but its kernels give a row of a batch other bits
than the same row decoded alone, so a model that verifies drafts must decode without it
(docs/exactness.md). The prompt pass needs no such guarantee: plain and speculative decoding
process the same prompt through the same kernels, so they get the same KV cache whichever
kernels those are. Only the rows that decide generated tokens (one-token steps and verified
drafts) must match.

So a :class:`PromptLayout` is a second copy of the model, loaded with repacking, with its own
context: a prompt piece of at least ``llama_backend.MIN_PROMPT_TOKENS`` tokens is decoded there, and its KV
cache is handed to the exact context with llama.cpp's sequence state API
(``llama_state_seq_get_data`` / ``llama_state_seq_set_data``). The prompt's last token is
decoded by the exact context, so the first generated token's logits come from the exact
kernels too. Costs: the repacked weights (about the size of the repacked tensors in the file)
and a second KV cache; ``memory_bytes`` says how much.

What changes: the bits of the prompt's KV cache depend on how the prompt was split between
passes (the repacked kernels are not batch invariant). Plain and speculative decoding split a
prompt the same way, so their outputs stay equal (``==``); but a prompt decoded in two pieces
(a prompt cache reusing the first) can differ in its last bits from the same prompt decoded
at once. ``make_llama(..., prompt_layout=False)`` keeps one layout where that matters.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import struct

from ngramcache.integrations.llama_backend import _Batch

__all__ = ["PromptLayout", "anonymous_bytes", "gguf_tensor_types", "repacked_share", "MIN_REPACKED_SHARE", "GGML_TYPE_NAMES"]

#: ggml's type ids, for the types GGUF models use (ggml.h)
GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
    11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS",
    18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16",
    26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}

# GGUF metadata value types and the sizes of the fixed-size ones
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_tensor_types(path: str | os.PathLike) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{tensor name: (ggml type name, dims)}`` read from a GGUF file's header (the data is
    not read). ValueError for a file that is not GGUF."""
    with open(path, "rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            raise ValueError(f"{os.fspath(path)}: not a GGUF file (empty)") from None
    with mm:
        if mm[:4] != b"GGUF":
            raise ValueError(f"{os.fspath(path)}: not a GGUF file (no GGUF magic)")
        if len(mm) < 24:
            raise ValueError(f"{os.fspath(path)}: GGUF header cut short")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", mm, 4)
        if version < 2:
            raise ValueError(f"{os.fspath(path)}: GGUF version {version} is not supported (2 or later)")
        off = 24

        def skip_value(vtype: int, off: int) -> int:
            if vtype in _GGUF_FIXED:
                return off + _GGUF_FIXED[vtype]
            if vtype == _GGUF_STRING:
                (n,) = struct.unpack_from("<Q", mm, off)
                return off + 8 + n
            if vtype == _GGUF_ARRAY:
                etype, count = struct.unpack_from("<IQ", mm, off)
                off += 12
                if etype in _GGUF_FIXED:
                    return off + count * _GGUF_FIXED[etype]
                for _ in range(count):
                    off = skip_value(etype, off)
                return off
            raise ValueError(f"{os.fspath(path)}: unknown GGUF value type {vtype}")

        try:
            for _ in range(n_kv):
                (n,) = struct.unpack_from("<Q", mm, off)
                (vtype,) = struct.unpack_from("<I", mm, off + 8 + n)
                off = skip_value(vtype, off + 12 + n)
            out = {}
            for _ in range(n_tensors):
                (n,) = struct.unpack_from("<Q", mm, off)
                name = mm[off + 8 : off + 8 + n].decode("utf-8", "replace")
                off += 8 + n
                (n_dims,) = struct.unpack_from("<I", mm, off)
                dims = struct.unpack_from(f"<{n_dims}Q", mm, off + 4)
                ttype, _offset = struct.unpack_from("<IQ", mm, off + 4 + 8 * n_dims)
                off += 4 + 8 * n_dims + 12
                out[name] = (GGML_TYPE_NAMES.get(ttype, f"type{ttype}"), tuple(dims))
        except (struct.error, ValueError) as e:
            if isinstance(e, ValueError) and "GGUF" in str(e):
                raise
            raise ValueError(f"{os.fspath(path)}: GGUF header cut short") from None
        return out


def _repacked_types(system_info: str) -> set[str]:
    """The weight types llama.cpp 0c1e5709 repacks on this CPU (ggml-cpu/repack.cpp), for
    matrices whose row count is a multiple of 8; empty where this is not known (not x86-64)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return set()
    if "AVX2 = 1" not in system_info:
        return set()
    types = {"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"}
    if "AVX512 = 1" in system_info:
        types.add("Q2_K")
    return types


#: a second layout is loaded by default when repacked matrices hold at least this share of
#: the model's matrix weights: measured on Gemma 3 270M, a 500-token prompt took 0.62x the time
#: through repacked weights where all its matrices are Q4_0 (share 1.0), but 0.96x at Q4_K_M
#: (share 0.24: its Q5_0 and Q8_0 matrices are not repacked on x86-64), not worth a second copy
MIN_REPACKED_SHARE = 0.5


def repacked_share(path: str | os.PathLike, system_info: str) -> float:
    """The share of a model's matrix weights (elements; the token embedding, only looked up,
    left out) that the CPU backend would repack: 0 means a second layout would only cost
    memory."""
    types = _repacked_types(system_info)
    total = repacked = 0
    for name, (t, dims) in gguf_tensor_types(path).items():
        if len(dims) != 2 or name == "token_embd.weight":
            continue
        total += dims[0] * dims[1]
        if t in types and dims[1] % 8 == 0:
            repacked += dims[0] * dims[1]
    return repacked / total if total else 0.0


class PromptLayout:
    """A second copy of a model, with repacked weights, that decodes prompts for an exact
    context (see the module's docstring). ``llm`` is the ``llama_cpp.Llama`` loaded with
    repacking; the exact context's backend drives it through :meth:`prefill` and
    :meth:`hand_over`."""

    def __init__(self, llm, memory_bytes: int, n_swa: int = 0):
        import llama_cpp

        self.llm = llm
        self.n_swa = n_swa
        self.ctx = llm._ctx.ctx
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_batch = llm.n_batch
        #: what the second layout costs: its repacked weights and its KV cache, in bytes
        self.memory_bytes = memory_bytes
        self._batch = None
        # positions [0, _valid) of sequence 0 hold what the exact context holds there
        self._valid = 0
        self._buf = None

    def close(self) -> None:
        if self._batch is not None:
            self._batch.free()
            self._batch = None
        self.llm.close()

    # -- keeping the two KV caches in step ------------------------------------------------
    def _copy(self, src_ctx, dst_ctx) -> None:
        import llama_cpp

        size = llama_cpp.llama_state_seq_get_size(src_ctx, 0)
        if self._buf is None or len(self._buf) < size:
            self._buf = (ctypes.c_uint8 * max(size, 1 << 20))()
        got = llama_cpp.llama_state_seq_get_data(src_ctx, self._buf, size, 0)
        if got != size:
            raise RuntimeError(f"llama_state_seq_get_data copied {got} of {size} bytes")
        if llama_cpp.llama_state_seq_set_data(dst_ctx, self._buf, size, 0) == 0:
            raise RuntimeError("llama_state_seq_set_data refused the KV cache being handed over")

    def forget_from(self, pos: int) -> None:
        """The exact context changed positions ``>= pos``."""
        self._valid = min(self._valid, pos)

    def clear(self) -> None:
        import llama_cpp

        llama_cpp.llama_memory_clear(self.mem, True)
        self._valid = 0

    def prefill(self, exact_ctx, tokens, pos0: int) -> None:
        """Decode ``tokens`` at positions ``pos0...`` here, no logits; the exact context must
        hold positions ``[0, pos0)`` (they are brought over first where this copy lacks them)
        and gets the result from :meth:`hand_over`."""
        import llama_cpp

        # a sliding-window cache that went on past pos0 has dropped positions pos0 attends to
        kept = not self.n_swa or int(llama_cpp.llama_memory_seq_pos_min(self.mem, 0)) <= max(0, pos0 - self.n_swa)
        if self._valid < pos0 or not kept or not llama_cpp.llama_memory_seq_rm(self.mem, 0, pos0, -1):
            if pos0 == 0:
                llama_cpp.llama_memory_clear(self.mem, True)
            else:
                self._copy(exact_ctx, self.ctx)
            self._valid = pos0
        for s in range(0, len(tokens), self.n_batch):
            part = tokens[s : s + self.n_batch]
            if self._batch is None or self._batch.capacity < len(part):
                if self._batch is not None:
                    self._batch.free()
                self._batch = _Batch(max(len(part), self.n_batch))
            self._batch.fill(part, pos0 + s, len(part))
            rc = llama_cpp.llama_decode(self.ctx, self._batch.b)
            if rc != 0:
                self._valid = min(self._valid, pos0 + s)
                raise RuntimeError(f"llama_decode failed in the prompt layout (return code {rc})")
        self._valid = pos0 + len(tokens)

    def hand_over(self, exact_ctx) -> None:
        """Give the exact context this copy's KV cache for sequence 0."""
        self._copy(self.ctx, exact_ctx)


def anonymous_bytes() -> int:
    """This process's anonymous memory (what a second copy of mapped weights adds is its
    repacked matrices and buffers, not the file's pages, which both copies share); 0 where
    /proc does not say."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Anonymous:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
