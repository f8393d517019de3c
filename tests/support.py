"""What several test modules share (test modules import from here, never from each other):
fake and tiny models, a served process and raw HTTP, small corpora and tokenizers, the replay
loop through a drafter's Python API. Imports of optional packages (torch, transformers,
openai, tokenizers) wait until a helper needs them, so that importing this module needs none.
Fixtures are imported by name into the modules that use them."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from conftest import V, next_token
from ngramcache import DraftStats


# --- a fake model for the decoding loop -----------------------------------------------------

class FakeModel:
    """A Backend whose logits at a position depend only on the prefix up to it
    (batched or not). It checks the loop's positions: every decode must append at
    the current end, and logits may only be read where they were asked for."""

    def __init__(self, n_ctx: int = 1024, n_batch: int = 16, eos: int | None = None, peaked: bool = True):
        self.n_vocab = V
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.eos = eos
        self.peaked = peaked
        self.kv: list[int] = []
        self.rows: dict[int, np.ndarray] = {}
        self.decodes: list[int] = []  # batch sizes

    def row_for(self, prefix: list[int]) -> np.ndarray:
        t = next_token(prefix)
        if self.peaked:
            row = np.zeros(V, dtype=np.float32)
            row[t] = 10.0
            return row
        # a broad distribution whose mode is still t
        rng = np.random.default_rng(len(prefix) * 1000 + sum(prefix[-4:]))
        row = rng.normal(0, 0.5, V).astype(np.float32)
        row[t] += 4.0
        return row

    def tokenize(self, prompt):
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            return np.frombuffer(prompt.encode(), dtype=np.uint8).astype(np.int32) % V
        return np.asarray(prompt, dtype=np.int32)

    def clear(self):
        self.kv = []
        self.rows = {}

    def decode(self, tokens, pos0, logits_from):
        assert pos0 == len(self.kv), f"decode at {pos0} but the cache holds {len(self.kv)}"
        assert 0 < len(tokens) <= max(self.n_batch, 1)
        self.decodes.append(len(tokens))
        self.rows = {}
        for i, t in enumerate(tokens):
            self.kv.append(int(t))
            if i >= logits_from:
                self.rows[i] = self.row_for(self.kv)
        assert len(self.kv) <= self.n_ctx

    def logits(self, i):
        return self.rows[i]

    def truncate(self, pos):
        assert 0 <= pos <= len(self.kv)
        del self.kv[pos:]

    def is_eog(self, tok):
        return tok == self.eos

    def piece(self, tok):
        return f"<{tok}>".encode()


class RejectingDrafter:
    """Proposes the model's true continuation with one token corrupted, the corrupted
    position cycling 0, 1, 2, ... so that rejection (and rollback) happens at every
    draft position; every few steps it proposes the uncorrupted continuation."""

    def __init__(self, n_draft: int = 6):
        self.n_draft = n_draft
        self.seq: list[int] = []
        self.step = 0
        self._stats = DraftStats()

    @property
    def stats(self):
        return self._stats

    def reset(self, prompt_tokens):
        self.seq = [int(t) for t in prompt_tokens]

    def propose(self, n_max):
        n = min(n_max, self.n_draft)
        s = list(self.seq)
        d = []
        for _ in range(n):
            t = next_token(s)
            d.append(t)
            s.append(t)
        j = self.step % (self.n_draft + 1)
        self.step += 1
        if j < len(d):
            d[j] = (d[j] + 1) % V
        return np.asarray(d, dtype=np.int32)

    def accept(self, tokens):
        self.seq.extend(int(t) for t in tokens)


# the serving engine's fake backend: next_token's text, a decode that may wait or be held
SERVING_VOCAB = 64


class ServingFakeModel:
    """A Backend whose next token is ``conftest.next_token`` of the prefix. ``delay``:
    seconds each decode takes; ``hold``: an Event every decode waits for (a model stuck
    in a decode)."""

    def __init__(self, n_ctx: int = 4096, delay: float = 0.0, hold: threading.Event | None = None):
        self.n_vocab, self.n_ctx, self.n_batch = SERVING_VOCAB, n_ctx, 16
        self.delay, self.hold = delay, hold
        self.kv: list[int] = []
        self.rows: dict[int, np.ndarray] = {}

    def tokenize(self, prompt):
        if isinstance(prompt, str):
            return np.frombuffer(prompt.encode(), dtype=np.uint8).astype(np.int32) % SERVING_VOCAB
        return np.asarray(prompt, dtype=np.int32)

    def clear(self):
        self.kv, self.rows = [], {}

    def decode(self, tokens, pos0, logits_from):
        if self.hold is not None:
            self.hold.wait()
        if self.delay:
            time.sleep(self.delay)
        assert pos0 == len(self.kv)
        self.rows = {}
        for i, t in enumerate(tokens):
            self.kv.append(int(t))
            if i >= logits_from:
                row = np.zeros(SERVING_VOCAB, dtype=np.float32)
                row[next_token(self.kv)] = 10.0
                self.rows[i] = row
        assert len(self.kv) <= self.n_ctx

    def logits(self, i):
        return self.rows[i]

    def truncate(self, pos):
        del self.kv[pos:]

    def is_eog(self, tok):
        return False

    def piece(self, tok):
        return f"<{tok}>".encode()


# --- replay through a drafter's Python API -------------------------------------------------

def python_replay(d, toks: np.ndarray, n_ctx: int, n_draft: int) -> dict:
    """replay_drafter's loop through the drafter's Python API."""
    n_chunks = (toks.size - 1) // n_ctx if toks.size > n_ctx else 0
    out = {"n_drafted": 0, "n_accept": 0, "n_steps": 0, "accept_length_hist": [0] * (n_draft + 1)}
    for c in range(n_chunks):
        chunk = toks[c * n_ctx : (c + 1) * n_ctx]
        d.reset(chunk[:1])
        have = 1
        while have < n_ctx:
            p = d.propose(n_draft)
            acc = 0
            while acc < p.size and have + acc < n_ctx and p[acc] == chunk[have + acc]:
                acc += 1
            out["n_steps"] += 1
            out["n_drafted"] += p.size
            out["n_accept"] += acc
            if p.size:
                out["accept_length_hist"][acc] += 1
            n_new = min(acc + 1, n_ctx - have)
            d.accept(chunk[have : have + n_new])
            have += n_new
    return out


# --- tiny transformers models ----------------------------------------------------------------

def tiny_model(vocab: int = 48, seed: int = 0, sharpen: float = 1.0):
    """A 2-layer Llama with random weights; ``sharpen`` scales the output layer, making
    its next-token distributions peaked."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      bos_token_id=0, eos_token_id=1, pad_token_id=1, tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():
        m.lm_head.weight.mul_(sharpen)
    m.eval()
    return m


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(sharpen=8.0)


@pytest.fixture(scope="module", autouse=True)
def own_cost_store(tmp_path_factory):
    """Verification costs measured here are kept in a folder of the tests, not the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NGRAMCACHE_CACHE_DIR", str(tmp_path_factory.mktemp("costs")))
        yield


def plain(model, ids, **kw):
    """Plain greedy generate, the reference of every drafted run."""
    return model.generate(ids, do_sample=False, **kw)


def prompt_ids(vocab: int = 48, n: int = 24, seed: int = 1):
    """A (1, n) prompt of random ids whose second half repeats the first: something to copy."""
    import torch

    rng = np.random.default_rng(seed)
    base = rng.integers(2, vocab, size=n // 2)
    return torch.from_numpy(np.concatenate([base, base])[None, :].astype(np.int64))  # a repeat to copy from


# --- a served process and raw HTTP -----------------------------------------------------------

SERVE_CTX = 2048

# The servers here draft without the adaptive gate: what is under test is not drafting, and
# the gate's cost measurement (minutes on a loaded machine) would only delay every start.
FIXED_DRAFT = "--fixed-draft"


class Server:
    """A `python -m ngramcache serve` process on a free port of 127.0.0.1."""

    def __init__(self, *flags: str, env: dict | None = None):
        cmd = [sys.executable, "-m", "ngramcache", "serve", "-m", "smollm2", "--port", "0", "-c", str(SERVE_CTX),
               *flags]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                     env={**os.environ, **(env or {})})
        self.log: list[str] = []
        deadline = time.monotonic() + 240
        self.url = None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
            if m:
                self.url = m.group(1)
                break
        if self.url is None:
            self.proc.kill()
            rest = self.proc.stderr.read()
            self.proc.wait(30)
            self.proc.stderr.close()
            raise RuntimeError("the server did not start:\n" + "".join(self.log) + rest)
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def client(self, timeout: float = 300, **kw) -> "openai.OpenAI":
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=timeout, **kw)

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return r.read().decode()

    def post(self, path: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, data=body, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            with e:  # its socket, closed now rather than by the garbage collector
                return e.code, json.loads(e.read())

    def metric(self, name: str) -> float:
        m = re.search(rf"^{name} (\S+)$", self.get("/metrics"), re.M)
        assert m, f"{name} not in /metrics"
        return float(m.group(1))

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self._reader.join(10)
        self.proc.stderr.close()
        return rc


def chat(client, messages, **kw):
    """A greedy chat completion from the served model."""
    return client.chat.completions.create(model="smollm2", messages=messages, temperature=0, **kw)


def rss_kb(pid: int) -> int:
    """The resident memory of process ``pid``, in KiB (0 once it is gone)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def save_under_way(pid: int, folder: Path) -> bool:
    """Whether the process is writing a temporary file in ``folder``: a named one (file
    systems without anonymous files) or, on Linux, an anonymous one it holds open, which
    /proc shows as ``FOLDER/#INODE (deleted)``."""
    if any(p.name.startswith(".memory.bin") for p in folder.iterdir()):
        return True
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(f"{folder}/#"):
                return True
        except OSError:
            continue
    return False


def post_raw(url: str, body: bytes, timeout: float = 120) -> tuple[int, bytes]:
    """POST ``body`` as JSON to ``url``: the status and the raw answer, an HTTP error's too."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        with e:  # its socket, closed now rather than by the garbage collector
            return e.code, e.read()


def raw_post(url: str, head_fields: str, parts=()) -> tuple[int, dict]:
    """POST /v1/completions over a socket: the head, then ``parts`` as sent (a client
    that stops sending and reads the answer, so that what it reads is the server's)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"{head_fields}\r\n".encode())
        for part in parts:
            sock.sendall(part)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    return int(head.split()[1]), json.loads(body)


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


# --- corpora, tokenizers and models for the corpus commands ----------------------------------

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None


def stdlib_corpus(tmp_path: Path, limit: int = 300_000) -> Path:
    """A small real corpus: a slice of the standard library's source, as a directory."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    d = tmp_path / "corpus"
    d.mkdir()
    total = 0
    for i, name in enumerate(["functools.py", "csv.py", "shutil.py", "tempfile.py", "enum.py", "inspect.py"]):
        src = lib / name
        if not src.is_file():
            continue
        data = src.read_bytes()
        (d / f"{i:02d}_{name}").write_bytes(data)
        total += len(data)
        if total >= limit:
            break
    return d


def smollm2_path() -> str:
    if not HAVE_LLAMA:
        pytest.skip("llama-cpp-python not installed")
    from ngramcache.models import default_model_path
    try:
        return default_model_path("smollm2")
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def tiny_hf_json(tmp_path_factory, vectors_dir):
    """A small byte-level BPE tokenizer.json, trained on the reference prose."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    text = (vectors_dir / "prose.txt").read_text()
    tok.train_from_iterator([text[:50_000]], trainer=trainer)
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    tok.save(str(path))
    return path
