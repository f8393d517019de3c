"""What the end-to-end benchmarks (bench_e2e.py, bench_hf.py) share: their run options, the
variants and workloads those options pick, and the speed table they print (a row per workload, a column per variant, tok/s with the speedup over
plain and the share of the oracle's tok/s where there is one, and where a variant's text
differed from plain, the first position that differed)."""

from __future__ import annotations

import json


def speed_rows(res: dict, variants, key: str) -> list[str]:
    """Markdown header and rows for one model's results under ``key`` (e.g. ``gen_tok_s``)."""
    lines = ["| workload | prompt tok | " + " | ".join(variants) + " |", "|---|---:|" + "---:|" * len(variants)]
    for task, tr in res["tasks"].items():
        v = tr["variants"]
        base = v["plain"][key]
        oracle = v["oracle"][key] if "oracle" in v else None
        cells = []
        for name in variants:
            x = v[name][key]
            if name == "plain":
                cell = f"{x:.1f}"
            elif oracle is None:
                cell = f"{x:.1f} ({x / base:.2f}x)"
            else:
                cell = f"{x:.1f} ({x / base:.2f}x, {100 * x / oracle:.0f}%)"
            if not v[name]["identical"]:
                cell += f" ≠@{v[name]['first_divergence']}"
            cells.append(cell)
        lines.append(f"| {task} | {tr['n_prompt']} | " + " | ".join(cells) + " |")
    return lines


def add_run_arguments(ap, models: str, tokens_help: str) -> None:
    """The options every end-to-end benchmark takes: models, tokens, rounds, workloads."""
    ap.add_argument("--models", default=models, help="comma list of gemma, smollm2, or GGUF paths")
    ap.add_argument("--tokens", type=int, default=128, help=f"{tokens_help} (default 128)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per workload (default 3)")
    ap.add_argument("--workloads", default="all", help="comma list of workload names, or all")
    ap.add_argument("--json", metavar="FNAME", help="also write every figure here")


def chosen_variants(ap, spec: str, variants: tuple, always: set) -> tuple:
    """The variants ``spec`` (``--variants``: a comma list, or ``all``) names, plus ``always``,
    in the order of ``variants``; an unknown name is a usage error through ``ap``."""
    if spec == "all":
        return variants
    want = set(spec.split(",")) | always
    bad = want - set(variants)
    if bad:
        ap.error(f"unknown variants: {', '.join(sorted(bad))}")
    return tuple(v for v in variants if v in want)


def chosen_tasks(tasks: list, workloads: str, quick: bool) -> list:
    """The workloads ``--workloads`` names (``all``: every one; with ``--quick``, two of them)."""
    if workloads != "all":
        want = set(workloads.split(","))
        return [t for t in tasks if t.name in want]
    return [tasks[1], tasks[4]] if quick else tasks


def report(all_results: dict, variants, header: str, markdown, json_path: str | None, extra: dict) -> None:
    """Print ``header`` and the speed tables (generation alone, then end to end) made by
    ``markdown(all_results, key, variants)``; with ``json_path``, write ``extra`` and the
    results there too."""
    print(header)
    print(markdown(all_results, "gen_tok_s", variants))
    print(markdown(all_results, "e2e_tok_s", variants))
    if json_path:
        with open(json_path, "w") as f:
            json.dump({**extra, "results": all_results}, f, indent=1)
