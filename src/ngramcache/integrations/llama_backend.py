"""llama-cpp-python's model as a ``ngramcache.decoding.loop.Backend``: llama.cpp's low-level
API with our own batches, logits only where a token is decided, and rejected positions
removed from the KV cache (``llama_memory_seq_rm``)."""

from __future__ import annotations

import ctypes

import numpy as np

try:
    import llama_cpp
except ImportError:  # the loop still runs on any Backend; real models need the extra
    llama_cpp = None

from ngramcache._validate import as_tokens
from ngramcache.decoding.loop import Backend, is_backend

__all__ = ["LlamaBackend", "backend_of", "need_llama", "MIN_PROMPT_TOKENS"]

#: prompt pieces shorter than this stay in the exact context even with a prompt layout
#: (``ngramcache.integrations.llama_prompt``): handing the KV cache over costs two copies of
#: it, more than a few tokens decoded here
MIN_PROMPT_TOKENS = 32


def need_llama() -> None:
    """ImportError naming the extra unless llama-cpp-python is installed."""
    if llama_cpp is None:
        raise ImportError("this needs llama-cpp-python: pip install 'ngramcache[llama]'")


class _Batch:
    """A llama_batch we fill ourselves: one sequence, chosen outputs."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.b = llama_cpp.llama_batch_init(capacity, 0, 1)

    def fill(self, tokens, pos0: int, logits_from: int) -> None:
        b = self.b
        n = len(tokens)
        b.n_tokens = n
        for i in range(n):
            b.token[i] = int(tokens[i])
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = i >= logits_from

    def free(self) -> None:
        if self.b is not None:
            llama_cpp.llama_batch_free(self.b)
            self.b = None

    def __del__(self):
        self.free()


class LlamaBackend:
    """A ``llama_cpp.Llama`` as an ``ngramcache.decoding.loop.Backend``, through llama.cpp's
    low-level API: our own batches, logits only where asked, KV-cache truncation with
    ``llama_memory_seq_rm``. Get it with ``LlamaBackend.of(llm)``."""

    def __init__(self, llm):
        need_llama()
        if not isinstance(llm, llama_cpp.Llama):
            raise TypeError(f"llm must be a llama_cpp.Llama, got {type(llm).__name__}")
        self.llm = llm
        self.ctx = llm._ctx.ctx
        self.vocab = llm._model.vocab
        self.n_vocab = llm.n_vocab()
        self.n_ctx = llm.n_ctx()
        self.n_batch = llm.n_batch
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_swa = int(llama_cpp.llama_model_n_swa(llm._model.model)) if llm.context_params.swa_full is False else 0
        self._batch = _Batch(max(self.n_batch, 64))
        self._pieces: dict[int, bytes] = {}
        #: the repacked copy that decodes prompts (``ngramcache.integrations.llama_prompt``),
        #: attached by ``make_llama``; None decodes everything here
        self.prompt_layout = getattr(llm, "_ngramcache_prompt_layout", None)
        self._shift = 0  # batch indices the prompt layout took off the front of the last decode
        self._behind = False  # the prompt layout holds positions this context has not been given

    @classmethod
    def of(cls, llm) -> "LlamaBackend":
        """The backend of ``llm``, created once and kept on it."""
        b = getattr(llm, "_ngramcache_backend", None)
        if b is None:
            b = cls(llm)
            llm._ngramcache_backend = b
        return b

    def set_threads(self, n_threads: int | None, n_threads_batch: int | None) -> None:
        """Threads for single tokens and for batches (None: keep; ``n_threads_batch``
        None follows ``n_threads``)."""
        if n_threads is None and n_threads_batch is None:
            return
        nt = n_threads or self.llm.n_threads
        ntb = n_threads_batch or n_threads or self.llm.n_threads_batch
        llama_cpp.llama_set_n_threads(self.ctx, nt, ntb)

    def decode(self, tokens, pos0: int, logits_from: int) -> None:
        n = len(tokens)
        self._shift = 0
        layout = self.prompt_layout
        # a prompt piece (logits for its last token at most) long enough to pay for the hand-over
        if layout is not None and logits_from >= n - 1 and n - (logits_from < n) >= MIN_PROMPT_TOKENS:
            # behind, the layout holds the newest positions already; else it brings over what it lacks
            n_bulk = n - 1 if logits_from < n else n
            layout.prefill(self.ctx, tokens[:n_bulk], pos0)
            self._behind = True
            if n_bulk == n:
                return
            self._catch_up()
            # the last token here: the first generated token's logits come from the exact kernels
            tokens, pos0, logits_from = tokens[n_bulk:], pos0 + n_bulk, 0
            self._shift = n_bulk  # the caller asks for the row of its batch index n - 1
        elif self._behind:
            self._catch_up()
        if layout is not None:
            layout.forget_from(pos0)
        self._decode(tokens, pos0, logits_from)

    def _catch_up(self) -> None:
        self.prompt_layout.hand_over(self.ctx)
        self._behind = False

    def _decode(self, tokens, pos0: int, logits_from: int) -> None:
        if len(tokens) > self.n_batch:
            # llama.cpp would abort the process (GGML_ASSERT), not return an error
            raise ValueError(f"cannot decode {len(tokens)} tokens at once: n_batch is {self.n_batch}")
        if len(tokens) > self._batch.capacity:
            self._batch.free()
            self._batch = _Batch(len(tokens))
        self._batch.fill(tokens, pos0, logits_from)
        rc = llama_cpp.llama_decode(self.ctx, self._batch.b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed (return code {rc})")

    def logits(self, i: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, i - self._shift)
        if not ptr:
            raise RuntimeError(f"no logits for batch index {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def truncate(self, pos: int) -> None:
        if self._behind:
            self._catch_up()
        if self.prompt_layout is not None:
            self.prompt_layout.forget_from(pos)
        if not llama_cpp.llama_memory_seq_rm(self.mem, 0, pos, -1):
            raise RuntimeError(f"the KV cache refused to drop positions >= {pos}")

    def can_keep(self, n: int) -> bool:
        """Whether the KV cache can keep its first ``n`` positions and go on from there: a
        sliding-window cache (Gemma 3) has already dropped positions the next token would
        attend to once it went on more than a window past ``n``."""
        if not self.n_swa:
            return True
        if self._behind:
            self._catch_up()
        pos_min = int(llama_cpp.llama_memory_seq_pos_min(self.mem, 0))
        return pos_min <= max(0, n - self.n_swa)

    def clear(self) -> None:
        # Llama's own bookkeeping no longer matches the KV cache after we use it
        self.llm.reset()
        llama_cpp.llama_memory_clear(self.mem, True)
        if self.prompt_layout is not None:
            self.prompt_layout.clear()
        self._behind = False

    def is_eog(self, tok: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, tok))

    def piece(self, tok: int) -> bytes:
        p = self._pieces.get(tok)
        if p is None:
            buf = ctypes.create_string_buffer(256)
            n = llama_cpp.llama_token_to_piece(self.vocab, tok, buf, 256, 0, False)
            p = bytes(buf[: max(n, 0)])
            self._pieces[tok] = p
        return p

    def tokenize(self, prompt) -> np.ndarray:
        if isinstance(prompt, str):
            prompt = prompt.encode("utf-8")
        if isinstance(prompt, bytes):
            if not prompt:
                raise ValueError("prompt is empty")
            return np.asarray(self.llm.tokenize(prompt, add_bos=True, special=True), dtype=np.int32)
        arr = as_tokens(prompt, "prompt")
        if arr.size and int(arr.max()) >= self.n_vocab:
            raise ValueError(f"prompt: token id {int(arr.max())} is beyond the vocabulary ({self.n_vocab})")
        return arr


def backend_of(llm) -> Backend:
    """The backend of a ``llama_cpp.Llama``, or ``llm`` itself when it is a Backend."""
    if llama_cpp is not None and isinstance(llm, llama_cpp.Llama):
        return LlamaBackend.of(llm)
    if not is_backend(llm):
        raise TypeError(f"llm must be a llama_cpp.Llama or a Backend, got {type(llm).__name__}")
    return llm
