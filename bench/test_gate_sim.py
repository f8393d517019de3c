"""gate_sim's replay of a recorded prompt and output, on records small enough to check by hand."""

from __future__ import annotations

import json

import gate_sim
from ngramcache.decoding.gate import Gate, GateSettings, Priors

CHEAP = [1.0, 1.0, 1.0, 1.0, 1.0]  # every right token pays


def record(prompt, output):
    return {"workload": "w", "prompt": list(prompt), "output": list(output)}


def test_a_record_replays_its_output_from_its_prompt():
    phrase = list(range(10, 30))
    rec = record(phrase, [10] + phrase[1:] + [7])  # the output copies the prompt, then a new token
    s = gate_sim.replay_record(rec, "copy", 4, GateSettings(priors=Priors.FLAT, min_gain=0.0, risk=None), CHEAP)
    # the first output token comes with the prompt pass: the steps give the other 20
    assert s.gate.n_generated == 20 and s.n_chunks == 1
    assert s.n_accept > 10 and s.gate.speedup > 2.0  # copies of 4 right tokens, each step for one token's cost
    assert gate_sim.replay_record(record(phrase, [1]), "copy", 4, GateSettings(), CHEAP) is None


def test_a_shared_gate_learns_from_every_record_while_declining():
    gate = Gate([1.0] * 5, GateSettings(priors=Priors.FLAT, decay=1.0, min_gain=1e9, learn_costs=False))
    phrase = list(range(10, 30))
    for _ in range(2):
        s = gate_sim.replay_record(record(phrase, phrase), "copy", 4, gate)
        assert s.n_drafted == 0 and s.gate.n_offered > 0
    hits, trials = (sum(x) for x in zip(*(gate.tallies(st) for st in range(36))))
    assert trials.sum() > 0 and hits.sum() > 0


def test_simulate_prints_each_drafters_cells(tmp_path, capsys):
    phrase = list(range(10, 30))
    data = {"model": "m", "n_vocab": 100, "records": [record(phrase, phrase), record(phrase, [5, 6, 7, 8])]}
    (tmp_path / "m.json").write_text(json.dumps(data))
    table = gate_sim.simulate(["m"], tmp_path, {"m": [1.0, 1.3, 1.6]}, ["copy", "suffix"], 8, GateSettings())
    gate_sim.print_table(table, ["copy", "suffix"], summary=False)
    out = capsys.readouterr().out
    assert "| w | " in out and "m: copy worst" in out and "m: suffix worst" in out
