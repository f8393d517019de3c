"""A soak of `ngramcache serve`: one real server process (the packaged SmolLM2, a memory file
saved often, a small body limit) under two concurrent clients for a bounded time
(NGRAMCACHE_SOAK_SECONDS, default 240 s of load, longer only until every kind of request below
was sent once), sending a mix of chat and completion requests, streamed or not, some
cancelled mid-stream, with every registered drafter, prompt caching on and off, and bad input
of every documented kind. Checked: every status is a
documented one with its documented error body, the server's RSS stays flat after warm-up,
greedy probe requests sent during the load answer what they answered alone, and a SIGKILL
during the saves leaves a memory file that the next server loads. `pytest -s` shows the
figures of the run."""

from __future__ import annotations

import collections
import http.client
import itertools
import json
import os
import random
import signal
import threading
import time

import pytest
from support import FIXED_DRAFT, Server, post_raw, raw_post, rss_kb, save_under_way


pytestmark = [pytest.mark.model, pytest.mark.slow]

SECONDS = float(os.environ.get("NGRAMCACHE_SOAK_SECONDS", "240"))
MAX_BODY = 64 * 1024  # small, so that an oversized body is cheap to send
# few tokens of memory: the soak passes its bound many times, so forgetting and rebuilding
# the dynamic cache are part of what runs, and the memory's own size is bounded early
MEMORY_TOKENS = 6000
SAVE_INTERVAL_MIN = 0.02  # 1.2 s: the memory is saved between requests all through the load
# The server's RSS may grow from 25% to 100% of the load by at most this. After warm-up
# every structure is bounded: the KV cache and the ngram-mod table are allocated at start,
# and the history (MEMORY_TOKENS tokens, a few MiB of n-gram counts and suffix store at most)
# was filled and forgotten several times by then. What remains is the allocator's slack
# (arenas of the worker threads, freed blocks not returned); a leak of even 50 KiB per
# request passes it within the run.
RSS_GROWTH_MIB = 32
IDLE_WITHIN_S = 30  # the longest job asks 16 tokens: a second or two even on a busy machine
DOCUMENTED = {200, 400, 404, 413, 422, 503}  # docs/serve.md, "Errors"
# what a client does, a round at a time in a shuffled order: every kind comes early in the run
OPS = ["chat", "chat", "completion", "completion", "cancel", "cancel_raw", "bad", "bad"]

TOPICS = ["a stack", "a queue", "binary search", "a linked list", "bubble sort", "a counter", "fizzbuzz",
          "a timer", "a set", "a trie"]
CODE_PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "import os\n\ndef walk(path):",
                "1, 2, 3, 4, 5, 6,", "The quick brown fox"]

# bad input, each with what docs/serve.md says it gets: (path, body, status, code, param)
BAD = [
    ("/v1/chat/completions", b"{not json", 400, "invalid_json", None),
    ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, 422, "invalid_field", "max_tokens"),
    ("/v1/completions", {"prompt": 5}, 422, "invalid_field", "prompt"),
    ("/v1/completions", {"prompt": "x", "n": 2}, 422, "invalid_field", "n"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, 422, "invalid_field", "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 422, "invalid_field",
     "messages.0.role"),
    ("/v1/completions", {"prompt": "x", "speculative": {"drafter": "nope"}}, 400, None, "speculative.drafter"),
    ("/v1/completions", {"prompt": "x", "speculative": {"n_draft": 1000}}, 400, None, "speculative.n_draft"),
    ("/v1/completions", {"prompt": "x", "speculative": {"colour": "red"}}, 400, None, "speculative.colour"),
    ("/v1/completions", {"prompt": "x", "speculative": {"drafter": "suffix", "options": {"max_depth": 0}}}, 400,
     None, "speculative.options.max_depth"),
    ("/v1/completions", {"prompt": "x", "speculative": "copy"}, 422, "invalid_field", "speculative"),
    ("/v1/completions", {"prompt": "a\ud800b", "max_tokens": 2}, 400, "invalid_unicode", "prompt"),
    ("/v1/completions", {"prompt": "ab", "max_tokens": 2, "stream": True, "stop": ["\udfff"]}, 400,
     "invalid_unicode", "stop.0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi \ud800"}], "stream": True}, 400,
     "invalid_unicode", "messages.0.content"),
    ("/v1/completions", {"prompt": "", "max_tokens": 3}, 400, None, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 10**9], "max_tokens": 3}, 400, None, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 100000}, 400, "context_length_exceeded", "max_tokens"),
    ("/v1/completions", {"model": "gpt-nope", "prompt": "x"}, 404, "model_not_found", "model"),
    ("/v1/completions", {"prompt": "x" * (MAX_BODY + 10)}, 413, "request_too_large", None),
]


def _drafting_choices() -> list:
    from ngramcache.drafters import registry

    named = [{"drafter": s.name} for s in registry.specs()]
    return [None, {"enabled": False}, {"drafter": "suffix", "options": {"max_depth": 32}}, *named]


def _probes() -> list[tuple[str, dict]]:
    """Greedy requests whose answers depend on the request alone (no prompt cache): each
    plainly and with a drafter."""
    out = []
    for i, spec in enumerate([{"enabled": False}, {"drafter": "copy"}, {"drafter": "suffix"}, {"drafter": "mod"},
                              {"drafter": "lookup"}, {"drafter": "pld"}]):
        common = {"max_tokens": 16, "temperature": 0, "cache_prompt": False, "speculative": spec,
                  "stream": i % 2 == 1}
        if i % 3 == 0:
            out.append(("/v1/completions", {"prompt": CODE_PROMPTS[i % len(CODE_PROMPTS)], **common}))
        else:
            out.append(("/v1/chat/completions",
                        {"messages": [{"role": "user", "content": f"Write Python code for {TOPICS[i]}."}],
                         **common}))
    return out


def _answer_text(status: int, raw: bytes, streamed: bool) -> str:
    """The text of a 200 answer, streamed or whole; AssertionError for anything else."""
    assert status == 200, (status, raw[:500])
    if not streamed:
        choice = json.loads(raw)["choices"][0]
        return choice["text"] if "text" in choice else choice["message"]["content"]
    events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    parts = []
    for e in events[:-1]:
        obj = json.loads(e)
        assert "error" not in obj, obj
        choice = obj["choices"][0]
        parts.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    assert json.loads(events[-2])["choices"][0]["finish_reason"] in ("stop", "length")
    return "".join(parts)


class Soak:
    """Two clients against one server until a deadline, counting what they get."""

    def __init__(self, server: Server, seconds: float, probes: list):
        self.server = server
        self.deadline = time.monotonic() + seconds
        self.probes = probes
        self.statuses: collections.Counter = collections.Counter()
        self.kinds: collections.Counter = collections.Counter()
        self.probe_answers: list[tuple[int, str]] = []
        self.failures: list[str] = []
        self.lock = threading.Lock()
        # taken in turn by both clients, so that every drafter (and every bad input) comes
        # within the first few rounds
        self.n_drafting = len(_drafting_choices())
        self.drafting = itertools.cycle(_drafting_choices())
        self.bad_inputs = itertools.cycle(BAD)
        self.ops_done: collections.Counter = collections.Counter()
        self.drafters_used: collections.Counter = collections.Counter()
        self.bad_sent: set[int] = set()

    def count(self, kind: str, status: int | None) -> None:
        with self.lock:
            self.kinds[kind] += 1
            if status is not None:  # None: the client went away before any answer
                self.statuses[status] += 1

    def fail(self, what: str) -> None:
        with self.lock:
            self.failures.append(what)

    def covered(self) -> bool:
        """Whether every kind of request, drafting choice and bad input was sent."""
        with self.lock:
            return (set(self.ops_done) == set(OPS) and len(self.drafters_used) == self.n_drafting
                    and len(self.bad_sent) == len(BAD))

    def next_of(self, turns):
        with self.lock:
            return next(turns)

    def run_client(self, index: int) -> None:
        rng = random.Random(1000 + index)
        client = self.server.client(timeout=600)
        n = 0
        schedule: list[str] = []
        # past the deadline only until every kind was sent once (a few rounds)
        while (time.monotonic() < self.deadline or not self.covered()) and len(self.failures) < 20:
            n += 1
            try:
                if index == 0 and n % 6 == 0:
                    self.probe(n // 6)
                    continue
                if not schedule:
                    schedule = rng.sample(OPS, len(OPS))
                op = schedule.pop()
                getattr(self, op)(client, rng)
                with self.lock:
                    self.ops_done[op] += 1
            except Exception as e:  # every request must end in a documented answer
                self.fail(f"client {index} request {n}: {type(e).__name__}: {e}")

    def _options(self, rng: random.Random) -> dict:
        extra = {"cache_prompt": rng.random() < 0.5}
        spec = self.next_of(self.drafting)
        with self.lock:
            self.drafters_used[json.dumps(spec)] += 1
        if spec is not None:
            spec = dict(spec)
            if "drafter" in spec and rng.random() < 0.5:
                spec["n_draft"] = rng.randint(1, 16)
            extra["speculative"] = spec
        kw = {"max_tokens": rng.randint(1, 16), "extra_body": extra, "temperature": 0}
        if rng.random() < 0.25:
            kw.update(temperature=0.8, seed=rng.randint(0, 1000))
        if rng.random() < 0.2:
            kw["stop"] = ["\n\n", "."]
        return kw

    def _messages(self, rng: random.Random) -> list:
        topic = rng.choice(TOPICS)
        messages = [{"role": "user", "content": f"Write Python code for {topic}."}]
        if rng.random() < 0.3:  # a second turn: with cache_prompt, its prefix is in the KV cache
            messages += [{"role": "assistant", "content": f"class {topic.split()[-1].title()}:\n    pass"},
                         {"role": "user", "content": "Add a docstring."}]
        if rng.random() < 0.2:
            messages.insert(0, {"role": "system", "content": "You are a terse assistant."})
        return messages

    def _consume(self, stream, kind: str) -> None:
        finish = None
        with stream as s:
            for chunk in s:
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
        assert finish in ("stop", "length"), finish
        self.count(kind, 200)

    def chat(self, client, rng) -> None:
        kw = self._options(rng)
        if rng.random() < 0.5:
            self._consume(client.chat.completions.create(model="smollm2", messages=self._messages(rng), stream=True,
                                                         **kw), "chat_stream")
        else:
            r = client.chat.completions.create(model="smollm2", messages=self._messages(rng), **kw)
            assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= kw["max_tokens"]
            self.count("chat", 200)

    def completion(self, client, rng) -> None:
        kw = self._options(rng)
        prompt = rng.choice(CODE_PROMPTS)
        if rng.random() < 0.2:  # token ids
            prompt = [rng.randint(100, 40000) for _ in range(rng.randint(1, 40))]
        if rng.random() < 0.5:
            self._consume(client.completions.create(model="smollm2", prompt=prompt, stream=True, **kw),
                          "completion_stream")
        else:
            r = client.completions.create(model="smollm2", prompt=prompt, **kw)
            assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= kw["max_tokens"]
            self.count("completion", 200)

    def cancel(self, client, rng) -> None:
        """A stream the client closes after a few chunks (the role chunk, then text)."""
        kw = self._options(rng)
        kw["max_tokens"] = 16
        last = rng.randint(0, 2)
        with client.chat.completions.create(model="smollm2", messages=self._messages(rng), stream=True, **kw) as s:
            for i, _ in enumerate(s):
                if i == last:
                    break
        self.count("cancelled_stream", 200)

    def cancel_raw(self, client, rng) -> None:
        """A stream whose connection is dropped at once: the server may not have started it."""
        host, port = self.server.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=600)
        try:
            body = json.dumps({"prompt": rng.choice(CODE_PROMPTS), "max_tokens": 16, "stream": True})
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            if rng.random() < 0.5:
                r = conn.getresponse()
                assert r.status == 200, r.status
                r.read(1)
                self.count("dropped_stream", r.status)
            else:
                self.count("dropped_before_answer", None)
        finally:
            conn.close()

    def bad(self, client, rng) -> None:
        for _ in range(3):  # cheap: a few at a time
            self._bad(*self.next_of(self.bad_inputs))

    def _bad(self, path, body, status, code, param) -> None:
        with self.lock:
            self.bad_sent.add(BAD.index((path, body, status, code, param)))
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        if len(raw) > MAX_BODY:
            # announced by its Content-Length and refused before it is sent (100-continue)
            got, err = raw_post(self.server.url, f"Content-Length: {len(raw)}\r\nExpect: 100-continue\r\n")
        else:
            got, answer = post_raw(self.server.url + path, raw, timeout=600)
            err = json.loads(answer)
        self.count("bad_input", got)
        assert got == status, (body if len(raw) < 200 else path, got, err)
        assert set(err) == {"error"} and set(err["error"]) == {"message", "type", "param", "code"}, err
        assert err["error"]["message"], err
        if code is not None:
            assert err["error"]["code"] == code, (body, err)
        if param is not None:  # a field of a union names the member at fault after it (prompt.str)
            assert err["error"]["param"] == param or err["error"]["param"].startswith(param + "."), (body, err)

    def probe(self, i: int) -> None:
        k = i % len(self.probes)
        path, body = self.probes[k]
        status, raw = post_raw(self.server.url + path, json.dumps(body).encode(), timeout=600)
        self.count("probe", status)
        text = _answer_text(status, raw, body["stream"])
        with self.lock:
            self.probe_answers.append((k, text))


def _watch_rss(pid: int, stop: threading.Event, samples: list) -> None:
    t0 = time.monotonic()
    while not stop.wait(0.5):
        try:
            samples.append((time.monotonic() - t0, rss_kb(pid)))
        except OSError:
            return


def _rss_at(samples: list, t: float) -> int:
    return min(samples, key=lambda s: abs(s[0] - t))[1]


def _kill_while_saving(server: Server, folder, interval_s: float) -> bool:
    """SIGKILL ``server`` at a random moment of a phase of small learned requests and saves
    every ``interval_s``: the first save under way after a random delay. True if a save
    was seen under way when the signal went."""
    stop = threading.Event()

    def keep_learning():
        c = server.client(timeout=120)
        i = 0
        while not stop.is_set():
            i += 1
            try:
                c.completions.create(model="smollm2", prompt=f"{i} {random.choice(CODE_PROMPTS)}", max_tokens=4)
            except Exception:
                return  # the server is gone

    t = threading.Thread(target=keep_learning, daemon=True)
    t.start()
    time.sleep(random.uniform(0.0, 2 * interval_s))
    deadline = time.monotonic() + 30
    saving = False
    while time.monotonic() < deadline and not saving:
        saving = save_under_way(server.proc.pid, folder)
    server.proc.kill()
    server.proc.wait(30)
    stop.set()
    t.join(150)
    return saving


def _wait_idle(server, within_s: float) -> tuple[dict, float]:
    """/health once nothing is queued or running (or at the deadline), and the seconds that took."""
    t0 = time.monotonic()
    while True:
        health = json.loads(server.get("/health"))
        waited = time.monotonic() - t0
        if (health["queued"] == 0 and not health["busy"]) or waited > within_s:
            return health, waited
        time.sleep(0.05)


def test_soak_two_clients_every_kind_of_request(tmp_path):
    path = tmp_path / "memory.bin"
    server = Server(FIXED_DRAFT, "--memory", str(path), "--memory-save-interval", str(SAVE_INTERVAL_MIN),
                    "--memory-tokens", str(MEMORY_TOKENS), "--max-body-bytes", str(MAX_BODY))
    probes = _probes()
    try:
        exact = (json.loads(server.get("/health"))["exact"] or {}).get("exact")
        # alone, before the load: the answers to expect during it
        alone = []
        for path_, body in probes:
            status, raw = post_raw(server.url + path_, json.dumps(body).encode(), timeout=600)
            alone.append(_answer_text(status, raw, body["stream"]))
        rss_start = rss_kb(server.proc.pid)
        soak = Soak(server, SECONDS, probes)
        samples: list = []
        stop = threading.Event()
        watcher = threading.Thread(target=_watch_rss, args=(server.proc.pid, stop, samples), daemon=True)
        watcher.start()
        t0 = time.monotonic()
        clients = [threading.Thread(target=soak.run_client, args=(i,)) for i in range(2)]
        for c in clients:
            c.start()
        for c in clients:
            c.join(SECONDS + 900)
        duration = time.monotonic() - t0
        stop.set()
        watcher.join(10)
        assert not any(c.is_alive() for c in clients), "a client is stuck"
        # the clients' last requests may be dropped ones, which the engine stops at its next step
        health, idle_after = _wait_idle(server, IDLE_WITHIN_S)
        cancelled = server.metric("ngramcache_cancelled_total")
        saves_failed = server.metric("ngramcache_memory_save_errors_total")
        mid_save = _kill_while_saving(server, tmp_path, 60 * SAVE_INTERVAL_MIN)
    finally:
        server.stop(signal.SIGKILL)
    warm, end = _rss_at(samples, 0.25 * duration), _rss_at(samples, duration)
    n = sum(soak.statuses.values())
    print(f"\nsoak: {n} requests in {duration:.0f} s ({n / duration:.1f}/s), statuses "
          f"{dict(sorted(soak.statuses.items()))}, kinds {dict(sorted(soak.kinds.items()))}, "
          f"{len(soak.probe_answers)} probes under load; RSS start {rss_start / 1024:.0f} MiB, at 25% "
          f"{warm / 1024:.0f} MiB, end {end / 1024:.0f} MiB, peak {max(s[1] for s in samples) / 1024:.0f} MiB; "
          f"cancelled by the engine {cancelled:.0f}; {len(soak.bad_sent)} of {len(BAD)} bad inputs sent; "
          f"{len(soak.drafters_used)} drafting choices used; idle {idle_after:.2f} s after the load; "
          f"killed during a save: {mid_save}")
    assert not soak.failures, soak.failures
    assert soak.covered(), (soak.ops_done, soak.drafters_used, soak.bad_sent)
    assert set(soak.statuses) <= DOCUMENTED and 500 not in soak.statuses, soak.statuses
    assert health["queued"] == 0 and not health["busy"], (f"still busy {IDLE_WITHIN_S} s after the load", health)
    assert saves_failed == 0
    assert end - warm < RSS_GROWTH_MIB * 1024, f"RSS grew {(end - warm) / 1024:.1f} MiB after warm-up"
    assert soak.probe_answers, "no probe was sent during the load"
    for k, text in soak.probe_answers:
        # a drafted answer equals the plain one only where batched logits are exact (docs/exactness.md)
        if exact is not False or probes[k][1]["speculative"] == {"enabled": False}:
            assert text == alone[k], (probes[k], text, alone[k])
    # the file the SIGKILL left is whole: the next server loads it
    assert path.read_bytes().startswith(b"NGSRVMEM")
    again = Server(FIXED_DRAFT, "--memory", str(path), "--memory-tokens", str(MEMORY_TOKENS))
    try:
        assert again.metric("ngramcache_memory_tokens") > 0
    finally:
        again.stop()
    assert not any("damaged" in line for line in again.log), again.log
