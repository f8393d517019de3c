"""Makes the drafting gate's priors: the data file ``src/ngramcache/data/gate_priors.json``
(docs/gate.md, "Where the numbers come from"). It never writes into the source tree: it writes
the file named by ``--out``, starting from the package's current one and replacing the part it
makes, for a person to review and copy in.

    # the acceptance priors, from the benchmark workloads' recorded greedy outputs
    .venv/bin/python bench/gate_sim.py collect --models smollm2,gemma --out /tmp/gate-sim
    .venv/bin/python bench/make_gate_priors.py acceptance --dir /tmp/gate-sim --out /tmp/gate_priors.json

    # the cost curves per model size, measured on a quiet machine (nothing else running)
    .venv/bin/python bench/make_gate_priors.py costs --models smollm2,gemma --out /tmp/gate_priors.json

    cp /tmp/gate_priors.json src/ngramcache/data/gate_priors.json

``acceptance``: every drafter's proposals on every recorded output are scored against what
followed while its gate declines them all, per state (source, match length bucket, previous
outcome) and draft position; each state's rate is shrunk towards its source's and length's
(8 trials), and a shorter match is never given more than a longer one. ``costs``:
``calibrate`` (five interleaved rounds, medians, the closest non-decreasing curve) for batches
of 1..17 tokens after 512 tokens of context, one curve per model, with its parameter count.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import resources
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import gate_sim  # noqa: E402
from ngramcache.decoding.gate import Gate, GateSettings, Priors  # noqa: E402
from ngramcache.decoding.priors import LENGTH_BUCKETS, N_STATES  # noqa: E402
from ngramcache.drafters.base import Source  # noqa: E402

POSITION_BUCKETS = ((0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, None))
PREVIOUS = ("wrong", "right", "none")
#: trials a state's own rate is weighed against the level above it
STRENGTH = 8.0


def current() -> dict:
    """The package's data file as it stands."""
    return json.loads(resources.files("ngramcache.data").joinpath("gate_priors.json").read_text(encoding="utf-8"))


def write(data: dict, out: str) -> None:
    tmp = f"{out}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    print(f"wrote {out}")


def tally(models: list[str], in_dir: Path, drafters: list[str], n_draft: int) -> Gate:
    """One gate that saw every drafter's proposals on every record, declining them all (the
    gated replay of each record, gate_sim.replay_record)."""
    flat = [1.0] * (n_draft + 1)
    gate = Gate(flat, GateSettings(priors=Priors.FLAT, decay=1.0, min_gain=1e9, learn_costs=False))
    for dname in drafters:
        for name in models:
            data = json.loads((in_dir / f"{name}.json").read_text())
            for rec in data["records"]:
                gate_sim.replay_record(rec, dname, n_draft, gate)
    return gate


def fit(gate: Gate) -> list[dict]:
    """The table's rows from the tallies of :func:`tally`."""
    n_len, n_prev = len(LENGTH_BUCKETS), len(PREVIOUS)
    hits: dict = {}
    trials: dict = {}
    for st in range(N_STATES):
        src, rest = divmod(st, n_len * n_prev)
        b, pv = divmod(rest, n_prev)
        h, t = (x.tolist() for x in gate.tallies(st))
        for pb, (lo, hi) in enumerate(POSITION_BUCKETS):
            hh, tt = sum(h[lo:hi]), sum(t[lo:hi])
            for key in ((pb,), (src, pb), (src, b, pb), (src, b, pv, pb)):
                hits[key] = hits.get(key, 0.0) + hh
                trials[key] = trials.get(key, 0.0) + tt

    def mean(key, parent):
        return (hits.get(key, 0.0) + STRENGTH * parent) / (trials.get(key, 0.0) + STRENGTH)

    table = {}
    for src in range(len(Source)):
        for b in range(n_len):
            for pv in range(n_prev):
                row = []
                for pb in range(len(POSITION_BUCKETS)):
                    m0 = (hits.get((pb,), 0.0) + 1.0) / (trials.get((pb,), 0.0) + 2.0)
                    row.append(mean((src, b, pv, pb), mean((src, b, pb), mean((src, pb), m0))))
                table[(src, b, pv)] = row
    # a longer match is never less likely right: a length no data reached must not inherit
    # the source's pool, which long copies dominate
    for src in range(len(Source)):
        for pv in range(n_prev):
            for b in range(n_len - 2, -1, -1):
                table[(src, b, pv)] = [min(x, y) for x, y in zip(table[(src, b, pv)], table[(src, b + 1, pv)])]
    return [{"source": Source(src).name.lower(), "length": b, "previous": PREVIOUS[pv],
             "p": [round(x, 3) for x in row]} for (src, b, pv), row in sorted(table.items())]


def measure_costs(models: list[str], max_batch: int) -> list[dict]:
    from ngramcache import llama as nl

    out = []
    for name in models:
        path = gate_sim.model_path(name)
        llm = nl.make_llama(path, n_ctx=2048)
        import llama_cpp

        n_params = int(llama_cpp.llama_model_n_params(llm._model.model))
        costs = nl.calibrate(llm, max_batch=max_batch, repeats=5)
        curve = [round(c / costs[0], 2) for c in costs]
        print(name, n_params, curve, flush=True)
        out.append({"backend": "llama.cpp", "model": name, "params": n_params, "curve": curve})
        del llm
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("acceptance", help="fit the acceptance priors from gate_sim.py collect's records")
    a.add_argument("--models", default="smollm2,gemma")
    a.add_argument("--dir", default="/tmp/gate-sim")
    a.add_argument("--drafters", default="copy,suffix,lookup")
    a.add_argument("--n-draft", type=int, default=32)
    a.add_argument("--out", required=True, help="the JSON file to write (never the package's own)")
    c = sub.add_parser("costs", help="measure the packaged models' cost curves (on a quiet machine)")
    c.add_argument("--models", default="smollm2,gemma")
    c.add_argument("--max-batch", type=int, default=17)
    c.add_argument("--out", required=True, help="the JSON file to write (never the package's own)")
    args = ap.parse_args(argv)
    data = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else current()
    if args.cmd == "acceptance":
        data["acceptance"]["rows"] = fit(tally(args.models.split(","), Path(args.dir), args.drafters.split(","),
                                               args.n_draft))
    else:
        new = measure_costs(args.models.split(","), args.max_batch)
        names = {(r["backend"], r["model"]) for r in new}
        kept = [r for r in data["verify_costs"]["curves"] if (r["backend"], r["model"]) not in names]
        data["verify_costs"]["curves"] = kept + new
    write(data, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
