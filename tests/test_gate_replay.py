"""The gated replay (``replay_drafter(..., gate=...)``, ``stats --drafter NAME --gate``): the
compiled replay with the gate's core decides as a GatedDrafter does in a plain Python loop
over the same stream, step for step; its modelled speed-up; its errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ngramcache import _core
from ngramcache.cli.main import main as cli_main
from ngramcache.decoding.costs import extend_costs
from ngramcache.decoding.gate import Gate, GatedDrafter, GateSettings, Priors
from ngramcache.decoding.priors import FLAT_PRIOR, LENGTH_BUCKETS, N_STATES, cost_prior, state_index
from ngramcache.drafters.base import DraftStats, Source
from ngramcache.drafters.catalog import make_drafter
from ngramcache.replays import replay_drafter

CPU = [1.0, 1.68, 2.02, 2.6, 3.05, 3.39, 3.92, 4.4, 5.05]
FLAT_CURVE = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]


def text_like(n: int, seed: int) -> np.ndarray:
    """Phrases drawn from a small pool, now and then a fresh token: spans repeat, not always."""
    rng = np.random.default_rng(seed)
    pool = [rng.integers(0, 300, rng.integers(4, 30)) for _ in range(25)]
    out, size = [], 0
    while size < n:
        piece = pool[rng.integers(0, len(pool))] if rng.random() < 0.8 else rng.integers(0, 300, 1)
        out.append(piece)
        size += piece.size
    return np.concatenate(out)[:n].astype(np.int32)


def reference(tokens: np.ndarray, name: str, n_ctx: int, n_draft: int, gate: Gate, n_prompt: int = 1) -> dict:
    """The replay's loop in plain Python: a GatedDrafter (the decoding loops' own) in front of
    the drafter, each chunk a request from its first ``n_prompt`` tokens, the longest right
    prefix and the next token accepted."""
    d = GatedDrafter(make_drafter(name, n_draft=n_draft), gate)
    out = {"draft_length_hist": [0] * (n_draft + 1), "accept_length_hist": [0] * (n_draft + 1),
           "drafted_by_position": [0] * n_draft, "accepted_by_position": [0] * n_draft,
           "n_drafted": 0, "n_accept": 0, "n_steps": 0, "offered": 0, "declined": 0}
    for c in range((tokens.size - 1) // n_ctx):
        chunk = tokens[c * n_ctx : (c + 1) * n_ctx]
        d.reset(chunk[:n_prompt])
        have = n_prompt
        while have < n_ctx:
            draft = d.propose(n_draft)
            k, acc = int(draft.size), 0
            while acc < k and have + acc < n_ctx and chunk[have + acc] == draft[acc]:
                acc += 1
            out["n_steps"] += 1
            out["n_drafted"] += k
            out["n_accept"] += acc
            out["draft_length_hist"][k] += 1
            for j in range(k):
                out["drafted_by_position"][j] += 1
            for j in range(acc):
                out["accepted_by_position"][j] += 1
            if k:
                out["accept_length_hist"][acc] += 1
            n_new = min(acc + 1, n_ctx - have)
            d.accept(chunk[have : have + n_new])
            have += n_new
        out["offered"] += d.offered
        out["declined"] += d.declined
    return out


CASES = [  # drafter, curve, settings, stream seed, prompt tokens of each chunk
    ("copy", CPU, GateSettings(), 1, 1),
    ("copy", FLAT_CURVE, GateSettings(risk=None), 2, 1),
    ("suffix", CPU, GateSettings(priors=Priors.FLAT), 3, 1),
    ("pld", FLAT_CURVE, GateSettings(min_gain=0.0, decay=0.9), 4, 1),
    ("mod", CPU, GateSettings(prior_weight=1.0), 5, 1),
    ("simple", CPU, GateSettings(priors=Priors.FLAT), 6, 1),
    ("copy", CPU, GateSettings(), 7, 300),
    ("suffix", FLAT_CURVE, GateSettings(), 8, 450),
]


@pytest.mark.parametrize("name, curve, settings, seed, n_prompt", CASES)
def test_the_replay_decides_as_a_gated_drafter_in_a_python_loop(name, curve, settings, seed, n_prompt):
    tokens = text_like(3000, seed)
    n_ctx, n_draft = 700, 8
    fast, slow = Gate(curve, settings), Gate(curve, settings)
    got = replay_drafter(tokens, make_drafter(name, n_draft=n_draft), n_ctx, n_draft, gate=fast, n_prompt=n_prompt)
    want = reference(tokens, name, n_ctx, n_draft, slow, n_prompt)
    assert got.gate.n_generated == got.n_chunks * (n_ctx - n_prompt)
    for key in ("n_steps", "n_drafted", "n_accept", "draft_length_hist", "accept_length_hist",
                "drafted_by_position", "accepted_by_position"):
        assert getattr(got, key) == want[key], key
    assert (got.gate.n_offered, got.gate.n_declined) == (want["offered"], want["declined"])
    assert 0 < want["declined"] < want["offered"]  # the gate both cut and let through
    # both gates learnt the same, to the last bit: every proposal, the declined ones too, scored alike
    for s in range(N_STATES):
        for a, b in zip(fast.tallies(s), slow.tallies(s)):
            assert a.tolist() == b.tolist(), s
        assert fast.choose(s, n_draft) == slow.choose(s, n_draft)


def test_the_modelled_speedup_is_tokens_over_the_cost_of_the_steps():
    tokens = text_like(3000, 7)
    n_ctx, n_draft = 1000, 8
    s = replay_drafter(tokens, make_drafter("copy", n_draft=n_draft), n_ctx, n_draft, gate=GateSettings(), costs=CPU)
    g = s.gate
    assert g.costs == extend_costs(CPU, n_draft + 1)
    assert g.n_generated == s.n_chunks * (n_ctx - 1)
    # each step gives its accepted tokens and the model's own, but a chunk's last step may end on a drafted one
    assert s.n_steps + s.n_accept - s.n_chunks <= g.n_generated <= s.n_steps + s.n_accept
    assert g.modelled_time == pytest.approx(sum(n * g.costs[k] for k, n in enumerate(s.draft_length_hist)))
    assert g.speedup == pytest.approx(g.n_generated / g.modelled_time)
    assert g.speedup > 1.0  # a text of repeated phrases pays
    assert g.drafting_share == pytest.approx(1 - s.draft_length_hist[0] / s.n_steps)
    assert g.n_offered - g.n_declined == s.n_steps - s.draft_length_hist[0]
    # the ungated replay verifies every proposal whole
    plain = replay_drafter(tokens, make_drafter("copy", n_draft=n_draft), n_ctx, n_draft)
    assert plain.gate is None and plain.n_drafted >= s.n_drafted
    # the default curve is the package's prior for llama.cpp
    d = replay_drafter(tokens, make_drafter("copy", n_draft=n_draft), n_ctx, n_draft, gate=GateSettings())
    assert d.gate.costs == extend_costs(cost_prior("llama.cpp", None), n_draft + 1)
    # a dear curve: every proposal declined, one token per step at the cost of one
    dear = replay_drafter(tokens, make_drafter("copy", n_draft=4), n_ctx, 4, gate=GateSettings(),
                          costs=[1.0, 40.0])
    assert dear.n_drafted == 0 and dear.gate.speedup == 1.0 and dear.gate.drafting_share == 0.0
    assert dear.gate.n_declined == dear.gate.n_offered > 0
    json.dumps(s.to_dict(), allow_nan=False)


def test_the_cores_states_are_the_packages():
    core = _core.Gate([1.0, 2.0], LENGTH_BUCKETS, len(Source), (), min_gain=0.05, decay=0.97, prior_weight=4.0,
                      risk=None, flat_prior=FLAT_PRIOR)
    assert core.n_states == N_STATES
    for src in Source:
        for prev in range(3):
            for confidence in range(0, 12):
                assert core.state(confidence, prev, int(src)) == state_index(confidence, prev, src)


class Repeat:
    """A drafter of the bare protocol, in Python only."""

    n_draft = 4

    def __init__(self):
        self.stats, self.last = DraftStats(), 0

    def reset(self, prompt):
        self.last = int(prompt[-1]) if len(prompt) else 0

    def propose(self, n):
        return np.full(n, self.last, dtype=np.int32)

    def accept(self, tokens):
        self.last = int(tokens[-1])


def test_replay_gate_errors():
    tokens = text_like(600, 8)
    copy = make_drafter("copy", n_draft=4)
    with pytest.raises(ValueError, match="compiled core"):
        replay_drafter(tokens, Repeat(), 200, 4, gate=GateSettings())
    with pytest.raises(ValueError, match="give gate too"):
        replay_drafter(tokens, copy, 200, 4, costs=CPU)
    with pytest.raises(ValueError, match="own curve"):
        replay_drafter(tokens, copy, 200, 4, gate=Gate(CPU), costs=CPU)
    with pytest.raises(TypeError, match="GateSettings"):
        replay_drafter(tokens, copy, 200, 4, gate={"min_gain": 0.1})
    with pytest.raises(ValueError, match="costs"):
        replay_drafter(tokens, copy, 200, 4, gate=GateSettings(), costs=[1.0, -2.0])
    with pytest.raises(ValueError, match="n_prompt applies to a gated replay"):
        replay_drafter(tokens, copy, 200, 4, n_prompt=5)
    with pytest.raises(ValueError, match="n_prompt must be 1 to 199"):
        replay_drafter(tokens, copy, 200, 4, gate=GateSettings(), n_prompt=200)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("toks") / "t.i32"
    text_like(4000, 9).tofile(path)
    return path


def test_stats_gate_prints_what_the_gated_replay_models(token_file, capsys):
    argv = ["stats", "--tokens", str(token_file), "-c", "1000", "--spec-draft-n-max", "8", "--drafter", "copy",
            "--gate", "--costs", "1,1.68,2.02,2.6", "-q"]
    assert cli_main(argv + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = replay_drafter(np.fromfile(token_file, dtype=np.int32), make_drafter("copy", n_draft=8), 1000, 8,
                          gate=GateSettings(), costs=[1.0, 1.68, 2.02, 2.6])
    assert got["gate"]["speedup"] == pytest.approx(want.gate.speedup)
    assert got["gate"]["costs"] == want.gate.costs
    assert (got["n_drafted"], got["n_accept"]) == (want.n_drafted, want.n_accept)
    assert got["gate"]["n_declined"] == want.gate.n_declined
    assert cli_main(argv) == 0
    text = capsys.readouterr().out
    assert "modelled speed-up" in text and "steps that drafted" in text and f"{want.gate.speedup:.3f}x" in text
    # without --gate: no gate figures
    assert cli_main(argv[:-4] + ["--json"]) == 0
    assert "gate" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("extra, message", [
    (["--drafter", "lookup", "--gate"], "--gate applies to the drafters that ngramcache replays"),
    (["--gate"], "not to --drafter lookup"),
    (["--drafter", "copy", "--costs", "1,2"], "--costs applies to --gate"),
    (["--drafter", "copy", "--gate", "--costs", "1,x"], "--costs must be positive numbers"),
    (["--drafter", "copy", "--gate", "--costs", "1,-2"], "--costs must be positive numbers"),
])
def test_stats_gate_usage_errors(token_file, capsys, extra, message):
    assert cli_main(["stats", "--tokens", str(token_file), "-c", "1000", "-q"] + extra) == 2
    assert message in capsys.readouterr().err
