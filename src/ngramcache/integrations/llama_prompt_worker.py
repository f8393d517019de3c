"""The prompt through your own llama-cpp-python build, the tokens after it through the exact one.

llama-cpp-python as pip builds it by default (llamafile's kernels, built for this machine's CPU,
weights repacked) runs a prompt pass much faster than the exact build ngramcache installs, but
its kernels give a row of a batch other bits than the same row decoded alone (docs/exactness.md).
As with :class:`~ngramcache.integrations.llama_prompt.PromptLayout`, only the rows that decide
generated tokens must match; the prompt pass may run anywhere, as long as plain and speculative
decoding run it alike. One process holds one ``llama_cpp`` package, so a :class:`PromptWorker`
is a child process that loads the same model with that build (its folder first on
``PYTHONPATH``; ``ngramcache.integrations.default_build``): prompt pieces of at least
``llama_backend.MIN_PROMPT_TOKENS`` tokens are decoded there, and the KV cache comes back
through llama.cpp's sequence state API (the same source, so the same format). The prompt's last
token is decoded by the exact context, so the first generated token's logits come from the
exact kernels.

The two processes talk over a pair of pipes in frames: a header (``_HEAD``: operation, two
integers, payload length) and a payload (tokens as int32, or a sequence's state). The child
exits when its pipe closes, so it never outlives the process that made it.

    python -m ngramcache.integrations.llama_prompt_worker READ_FD WRITE_FD CONFIG_JSON

is the child.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path

import numpy as np

__all__ = ["PromptWorker"]

#: operation, two integers, payload length
_HEAD = struct.Struct("<cqqQ")
_READY, _OK, _ERROR, _NEED_STATE = b"R", b"K", b"E", b"N"
_PREFILL, _SET_STATE, _GET_STATE, _CLEAR, _QUIT = b"P", b"S", b"G", b"C", b"Q"
#: how long loading may take before the worker is given up (seconds)
START_TIMEOUT = 300.0


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_into(fd: int, view: memoryview) -> None:
    view = view.cast("B")
    while view:
        n = os.readv(fd, [view])
        if n == 0:
            raise EOFError("the other process closed its pipe")
        view = view[n:]


def _send(fd: int, op: bytes, a: int = 0, b: int = 0, payload=b"") -> None:
    size = memoryview(payload).nbytes
    _write_all(fd, _HEAD.pack(op, a, b, size))
    if size:
        _write_all(fd, payload)


def _receive_head(fd: int) -> tuple[bytes, int, int, int]:
    head = bytearray(_HEAD.size)
    _read_into(fd, memoryview(head))
    return _HEAD.unpack(head)


class _StateBuffer:
    """A growing ctypes buffer for a sequence's state (one allocation reused across prompts)."""

    def __init__(self):
        self.buf = None

    def sized(self, size: int):
        if self.buf is None or len(self.buf) < size:
            self.buf = (ctypes.c_uint8 * max(size, 1 << 20))()
        return self.buf


class PromptWorker:
    """A child process that decodes prompt pieces with another llama-cpp-python build and
    hands their KV cache to an exact context; the same methods as
    :class:`~ngramcache.integrations.llama_prompt.PromptLayout`. Made by :meth:`start`."""

    def __init__(self, proc: subprocess.Popen, to_child: int, from_child: int, log_path: str,
                 memory_bytes: int, n_swa: int, folder: Path):
        self._proc, self._to, self._from, self._log = proc, to_child, from_child, log_path
        #: what the worker costs: its process's anonymous memory once the model is loaded
        self.memory_bytes = memory_bytes
        self.n_swa = n_swa
        #: the llama-cpp-python build the prompts go through
        self.folder = folder
        self._state = _StateBuffer()
        # positions [0, _valid) of the worker's sequence 0 hold what the exact context holds there
        self._valid = 0
        self._finalizer = weakref.finalize(self, _stop, proc, to_child, from_child, log_path)

    @classmethod
    def start(cls, folder: Path, model_path: str, *, n_ctx: int, n_batch: int, n_threads: int,
              n_threads_batch: int, llama_kwargs: dict | None = None) -> "PromptWorker":
        """Start the worker on the build in ``folder`` and wait until the model is loaded.
        RuntimeError, with the child's last words, when it fails to start."""
        config = {"model_path": str(model_path), "n_ctx": n_ctx, "n_batch": n_batch, "n_threads": n_threads,
                  "n_threads_batch": n_threads_batch, "kwargs": llama_kwargs or {}}
        parent_read, child_write = os.pipe()
        child_read, parent_write = os.pipe()
        env = dict(os.environ)
        # the build's own defaults: llama-cpp-python's loading, ggml's tiled matmul as shipped
        env.pop("GGML_CPU_TILED_MM", None)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
        fd, log_path = tempfile.mkstemp(prefix="ngramcache-prompt-worker-", suffix=".log")
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ngramcache.integrations.llama_prompt_worker", str(child_read),
                 str(child_write), json.dumps(config)],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=fd,
                pass_fds=(child_read, child_write))
        finally:
            os.close(fd)
            os.close(child_read)
            os.close(child_write)
        try:
            op, memory, n_swa, size = _receive_head(parent_read)
            if op != _READY:
                raise EOFError
        except (EOFError, OSError):
            _stop(proc, parent_write, parent_read, log_path, remove=False)
            tail = _tail(log_path)
            os.unlink(log_path)
            raise RuntimeError(f"the prompt worker on {folder} did not start: {tail}") from None
        return cls(proc, parent_write, parent_read, log_path, memory, n_swa, Path(folder))

    # -- what the exact backend calls (PromptLayout's methods) -------------------------------
    def forget_from(self, pos: int) -> None:
        """The exact context changed positions ``>= pos``."""
        self._valid = min(self._valid, pos)

    def clear(self) -> None:
        self._request(_CLEAR)
        self._valid = 0

    def prefill(self, exact_ctx, tokens, pos0: int) -> None:
        """Decode ``tokens`` at positions ``pos0...`` in the worker; the exact context must hold
        positions ``[0, pos0)`` (they are sent over first where the worker lacks them)."""
        toks = np.ascontiguousarray(tokens, dtype=np.int32)
        given = self._valid < pos0
        if given:
            self._give_state(exact_ctx, pos0)
        if self._request(_PREFILL, pos0, int(given), toks) == _NEED_STATE:
            # its sliding window moved on past what pos0 attends to, or it could not cut its cache
            self._give_state(exact_ctx, pos0)
            self._request(_PREFILL, pos0, 1, toks)
        self._valid = pos0 + toks.size

    def hand_over(self, exact_ctx) -> None:
        """Give the exact context the worker's KV cache for sequence 0."""
        import llama_cpp

        _send(self._to, _GET_STATE)
        op, _, _, size = self._head()
        buf = self._state.sized(size)
        _read_into(self._from, memoryview(buf)[:size])
        if llama_cpp.llama_state_seq_set_data(exact_ctx, buf, size, 0) == 0:
            raise RuntimeError("llama_state_seq_set_data refused the KV cache the prompt worker handed over")

    def close(self) -> None:
        self._finalizer()

    # -- the frames ------------------------------------------------------------------------
    def _give_state(self, exact_ctx, pos0: int) -> None:
        import llama_cpp

        if pos0 == 0:
            self._request(_CLEAR)
        else:
            size = llama_cpp.llama_state_seq_get_size(exact_ctx, 0)
            buf = self._state.sized(size)
            got = llama_cpp.llama_state_seq_get_data(exact_ctx, buf, size, 0)
            if got != size:
                raise RuntimeError(f"llama_state_seq_get_data copied {got} of {size} bytes")
            self._request(_SET_STATE, 0, 0, memoryview(buf)[:size])
        self._valid = pos0

    def _request(self, op: bytes, a: int = 0, b: int = 0, payload=b"") -> bytes:
        try:
            _send(self._to, op, a, b, payload)
        except OSError:
            self._failed()
        return self._head()[0]

    def _head(self) -> tuple[bytes, int, int, int]:
        try:
            head = _receive_head(self._from)
        except (EOFError, OSError):
            self._failed()
        if head[0] == _ERROR:
            msg = bytearray(head[3])
            _read_into(self._from, memoryview(msg))
            raise RuntimeError(f"the prompt worker failed: {msg.decode('utf-8', 'replace')}")
        return head

    def _failed(self):
        self._valid = 0
        raise RuntimeError(f"the prompt worker on {self.folder} stopped: {_tail(self._log)}")

    def __repr__(self) -> str:
        return f"<PromptWorker {self.folder} pid={self._proc.pid} {self.memory_bytes / 2**20:.0f} MiB>"


def _tail(log_path: str, n: int = 3) -> str:
    try:
        lines = Path(log_path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no output"
    return " / ".join(lines[-n:]) or "no output"


def _stop(proc: subprocess.Popen, to_child: int, from_child: int, log_path: str, remove: bool = True) -> None:
    """Ask the worker to quit, then make sure it has (a closed pipe also ends it)."""
    try:
        _send(to_child, _QUIT)
    except OSError:
        pass
    for fd in (to_child, from_child):
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if remove:
        try:
            os.unlink(log_path)
        except OSError:
            pass


# -- the child --------------------------------------------------------------------------------
def _child(read_fd: int, write_fd: int, config: dict) -> int:
    import llama_cpp
    from llama_cpp._utils import suppress_stdout_stderr

    from ngramcache.integrations.llama_backend import _Batch
    from ngramcache.integrations.llama_prompt import anonymous_bytes

    with suppress_stdout_stderr(disable=False):
        llm = llama_cpp.Llama(model_path=config["model_path"], n_ctx=config["n_ctx"], n_batch=config["n_batch"],
                              n_threads=config["n_threads"], n_threads_batch=config["n_threads_batch"],
                              verbose=False, **config["kwargs"])
    ctx = llm._ctx.ctx
    mem = llama_cpp.llama_get_memory(ctx)
    n_swa = int(llama_cpp.llama_model_n_swa(llm._model.model)) if llm.context_params.swa_full is False else 0
    n_batch = llm.n_batch
    batch = _Batch(n_batch)
    state = _StateBuffer()
    _send(write_fd, _READY, anonymous_bytes(), n_swa)
    while True:
        try:
            op, a, b, size = _receive_head(read_fd)
        except EOFError:
            return 0
        payload = None
        if size:
            payload = state.sized(size)
            _read_into(read_fd, memoryview(payload)[:size])
        try:
            if op == _QUIT:
                return 0
            if op == _CLEAR:
                llama_cpp.llama_memory_clear(mem, True)
                _send(write_fd, _OK)
            elif op == _SET_STATE:
                if llama_cpp.llama_state_seq_set_data(ctx, payload, size, 0) == 0:
                    raise RuntimeError("llama_state_seq_set_data refused the exact context's KV cache")
                _send(write_fd, _OK)
            elif op == _GET_STATE:
                n = llama_cpp.llama_state_seq_get_size(ctx, 0)
                buf = state.sized(n)
                if llama_cpp.llama_state_seq_get_data(ctx, buf, n, 0) != n:
                    raise RuntimeError("llama_state_seq_get_data copied less than its size")
                _send(write_fd, _OK, 0, 0, memoryview(buf)[:n])
            elif op == _PREFILL:
                pos0, given = a, b
                tokens = np.frombuffer(memoryview(payload)[:size], dtype=np.int32).copy()
                # a sliding-window cache that went on past pos0 has dropped positions pos0 attends to
                kept = not n_swa or int(llama_cpp.llama_memory_seq_pos_min(mem, 0)) <= max(0, pos0 - n_swa)
                if not given and (not kept or not llama_cpp.llama_memory_seq_rm(mem, 0, pos0, -1)):
                    _send(write_fd, _NEED_STATE)
                    continue
                if given:
                    llama_cpp.llama_memory_seq_rm(mem, 0, pos0, -1)
                for s in range(0, tokens.size, n_batch):
                    part = tokens[s : s + n_batch]
                    batch.fill(part, pos0 + s, len(part))
                    rc = llama_cpp.llama_decode(ctx, batch.b)
                    if rc != 0:
                        raise RuntimeError(f"llama_decode failed (return code {rc})")
                _send(write_fd, _OK)
            else:
                raise RuntimeError(f"unknown operation {op!r}")
        except Exception as e:  # the parent reports it; the worker stays up for the next prompt
            _send(write_fd, _ERROR, 0, 0, str(e).encode("utf-8", "replace")[:4000])


if __name__ == "__main__":
    sys.exit(_child(int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])))
