"""`ngramcache serve` under hostile load, against a real server process (SmolLM2 by default):

1. **load**: N concurrent prompts of M MB each (refused by their length) while a 4-token
   chat request is timed, beside the same request on an idle server (the baseline, in the
   same run); the server's peak resident memory during the phase;
2. **connections**: K idle connections held open while /health is timed;
3. **soak**: --minutes of mixed good and bad requests from a few clients (chats and
   completions, streamed or not; bad JSON, lone surrogates, wrong keys, foreign Host
   headers, oversized bodies and prompts, unknown routes, heads that never finish), with
   the resident memory sampled throughout: every answer below 500, every good request
   answered with text, and the memory's drift after the first minute.

    python bench/bench_serve_hostile.py --minutes 10 [--json out.json]

Prints one JSON object. Loopback only; the server's own port (0: a free one).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time

KEY = "bench-key-0123456789"


class Server:
    def __init__(self, model: str, ctx: int, *flags: str):
        cmd = [sys.executable, "-m", "ngramcache", "serve", "-m", model, "--port", "0", "-c", str(ctx),
               "--fixed-draft", "--no-memory", "--max-queue", "16", *flags]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "NGRAMCACHE_API_KEY": KEY})
        self.log: list[str] = []
        deadline = time.monotonic() + 300
        self.port = None
        while time.monotonic() < deadline and self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("the server did not start:\n" + "".join(self.log))
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()

    def rss_mb(self) -> float:
        return _status_kb(self.proc.pid, "VmRSS") / 1024

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(120)


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def request(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
            timeout: float = 300) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}", **(headers or {})}
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


SMALL_CHAT = json.dumps({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
                         "temperature": 0}).encode()


def _timed_small(port: int) -> float:
    t0 = time.perf_counter()
    status, raw = request(port, "POST", "/v1/chat/completions", SMALL_CHAT)
    took = time.perf_counter() - t0
    if status != 200:
        raise RuntimeError(f"the small request got {status}: {raw[:300]!r}")
    return took


class RssSampler:
    """The server's resident memory every ``every`` seconds, in a thread."""

    def __init__(self, server: Server, every: float):
        self.server, self.every = server, every
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        t0 = time.monotonic()
        while not self._stop.is_set():
            self.samples.append((time.monotonic() - t0, self.server.rss_mb()))
            self._stop.wait(self.every)

    def stop(self) -> list[tuple[float, float]]:
        self._stop.set()
        self._thread.join()
        return self.samples


def load_phase(server: Server, n_big: int, big_mb: float) -> dict:
    for _ in range(2):  # warm-up: the first requests pay for first-use costs
        _timed_small(server.port)
    baseline = [_timed_small(server.port) for _ in range(5)]
    prompt = ("The quick brown fox jumps over the lazy dog. " * (int(big_mb * 1e6) // 45 + 1))[: int(big_mb * 1e6)]
    body = json.dumps({"prompt": prompt, "max_tokens": 1}).encode()
    answers: list[tuple[int, bytes]] = []
    sampler = RssSampler(server, 0.02)
    threads = [threading.Thread(target=lambda: answers.append(request(server.port, "POST", "/v1/completions", body)))
               for _ in range(n_big)]
    for t in threads:
        t.start()
    time.sleep(0.2)  # the bodies are on their way
    loaded = _timed_small(server.port)
    for t in threads:
        t.join()
    samples = sampler.stop()
    codes = sorted({(s, json.loads(raw)["error"]["code"] if s != 200 else None) for s, raw in answers})
    return {"big_requests": n_big, "big_mb": big_mb, "big_answers": [list(c) for c in codes],
            "small_alone_s": round(statistics.median(baseline), 3), "small_beside_big_s": round(loaded, 3),
            "ratio": round(loaded / statistics.median(baseline), 2),
            "peak_rss_mb": round(max(r for _, r in samples), 1)}


def connections_phase(server: Server, n_idle: int) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n_idle + 256)), hard))
    idle = []
    try:
        for _ in range(n_idle):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=30))
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            status, _ = request(server.port, "GET", "/health")
            times.append(time.perf_counter() - t0)
            assert status == 200
            time.sleep(0.1)
        still_open = 0
        for sock in idle:
            sock.settimeout(0.001)
            try:
                still_open += sock.recv(1) != b""
            except socket.timeout:
                still_open += 1
            except OSError:
                pass
    finally:
        for sock in idle:
            sock.close()
    return {"idle_connections": n_idle, "health_max_s": round(max(times), 4),
            "health_median_s": round(statistics.median(times), 4), "idle_still_open": still_open}


# --- the soak --------------------------------------------------------------------------------

GOOD = [
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8}),
    ("POST", "/v1/completions", {"prompt": "def add(a, b):", "max_tokens": 8}),
    ("POST", "/v1/completions", {"prompt": "1, 2, 3, 4,", "max_tokens": 6, "stream": True}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Count to three."}], "max_tokens": 8,
                                      "stream": True}),
    ("GET", "/v1/models", None), ("GET", "/metrics", None), ("GET", "/health", None),
]


BAD = ["json", "surrogate", "utf8", "key", "host", "big_prompt", "big_body", "route", "fields", "nested", "slow_head"]


def _bad_request(port: int, kind: str) -> int:
    """One request of a bad kind: its status (0: none expected, a head that never ends)."""
    post = lambda body, headers=None: request(port, "POST", "/v1/completions", body, headers)  # noqa: E731
    if kind == "json":
        return post(b'{"prompt": "hi", "max_tokens":')[0]
    if kind == "surrogate":
        return post(b'{"prompt": "hi", "speculative": {"\\ud800": 1}}')[0]
    if kind == "utf8":
        return post(b'{"prompt": "caf\xe9"}')[0]
    if kind == "key":
        return post(b'{"prompt": "hi"}', {"Authorization": "Bearer wrong"})[0]
    if kind == "host":
        return request(port, "GET", "/health", headers={"Host": "attacker.example"})[0]
    if kind == "big_prompt":
        return post(json.dumps({"prompt": "word " * 400_000}).encode())[0]
    if kind == "big_body":
        return post(b'{"prompt": "' + b"x" * (17 << 20) + b'"}')[0]
    if kind == "route":
        return request(port, "GET", "/admin")[0]
    if kind == "fields":
        return post(json.dumps({"prompt": "hi", "max_tokens": -1, "top_k": 10 ** 40}).encode())[0]
    if kind == "nested":
        return post(b"[" * 50_000 + b"]" * 50_000)[0]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:  # a head that never ends
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    return 0


def _good_request(port: int, rng: random.Random) -> tuple[int, bool]:
    method, path, body = rng.choice(GOOD)
    status, raw = request(port, method, path, None if body is None else json.dumps(body).encode())
    if status != 200:
        return status, False
    if path.endswith("completions"):
        if body.get("stream"):
            events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
            return status, events[-1] == "[DONE]" and not any('"error"' in e for e in events[:-1])
        reply = json.loads(raw)["choices"][0]
        return status, bool(reply.get("text") or reply.get("message", {}).get("content") is not None)
    return status, True


def soak_phase(server: Server, minutes: float, clients: int, seed: int) -> dict:
    end = time.monotonic() + 60 * minutes
    sampler = RssSampler(server, 5.0)
    lock = threading.Lock()
    tally = {"good": 0, "good_answered": 0, "bad": 0, "status": {}, "errors": {}}

    def client(i: int):
        rng = random.Random(seed + i)
        while time.monotonic() < end:
            try:
                if rng.random() < 0.5:
                    kind = "good"
                    status, ok = _good_request(server.port, rng)
                    with lock:
                        tally["good"] += 1
                        tally["good_answered"] += ok
                else:
                    kind = rng.choice(BAD)
                    status = _bad_request(server.port, kind)
                    with lock:
                        tally["bad"] += 1
                with lock:
                    tally["status"][str(status)] = tally["status"].get(str(status), 0) + 1
            except OSError as e:
                # a body over the bound is answered 413 and its connection closed before the
                # client has sent it all: the client sees a reset. Counted by the request's kind.
                with lock:
                    key = f"{kind}: {type(e).__name__}"
                    tally["errors"][key] = tally["errors"].get(key, 0) + 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    samples = sampler.stop()
    warm = [r for t, r in samples if t >= 60] or [r for _, r in samples]
    fifth = max(1, len(warm) // 5)
    first, last = statistics.median(warm[:fifth]), statistics.median(warm[-fifth:])
    span_min = max(1e-9, (samples[-1][0] - 60) / 60) if samples[-1][0] > 60 else None
    return {"minutes": minutes, "clients": clients, "good_requests": tally["good"],
            "good_answered": tally["good_answered"], "bad_requests": tally["bad"],
            "statuses": dict(sorted(tally["status"].items())),
            "server_errors_5xx": sum(n for s, n in tally["status"].items() if s.startswith("5")),
            "client_side_errors": dict(sorted(tally["errors"].items())),
            "rss_mb_after_warmup_first_fifth": round(first, 1), "rss_mb_last_fifth": round(last, 1),
            "rss_drift_mb_per_min": None if span_min is None else round((last - first) / span_min, 2),
            "rss_mb_min_max_after_warmup": [round(min(warm), 1), round(max(warm), 1)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the soak (default: 10)")
    ap.add_argument("--clients", type=int, default=4, help="soak clients at once (default: 4)")
    ap.add_argument("--big", type=int, default=12, help="concurrent long prompts in the load phase (default: 12)")
    ap.add_argument("--big-mb", type=float, default=16.0, help="megabytes of each long prompt (default: 16)")
    ap.add_argument("--idle", type=int, default=1000, help="idle connections in the connections phase (default: 1000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    # the 16 MB prompts and their JSON fit the server's body bound
    server = Server(args.model, args.ctx, "--max-body-bytes", str(int(args.big_mb * 1e6) + (1 << 20)))
    result = {"model": args.model, "ctx": args.ctx, "rss_mb_at_start": round(server.rss_mb(), 1)}
    try:
        result["load"] = load_phase(server, args.big, args.big_mb)
        result["connections"] = connections_phase(server, args.idle)
        if args.minutes > 0:
            result["soak"] = soak_phase(server, args.minutes, args.clients, args.seed)
        result["server_peak_rss_mb"] = round(_status_kb(server.proc.pid, "VmHWM") / 1024, 1)
    finally:
        result["server_exit"] = server.stop()
        log = "".join(server.log)
        result["server_log_tracebacks"] = log.count("Traceback")
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
