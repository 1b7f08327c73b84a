#!/usr/bin/env python3
"""Write the table of the newest benchmark results into ``benchmarks/README.md``, and the
per-night tables of the scale run into ``benchmarks/SCALE.md``.

For each bench that writes JSON, the newest ``benchmarks/results/<kind>-<UTC time>.json`` (by
the time stamp in its name; ``bench_scale`` writes ``scale-<ROWS>[-d<DIMS>]-<UTC time>.json``)
gives one row: its headline figures (ratios, rows/s, peak RSS) and how many of its targets it
met. The committed baselines (``*-before-main-*.json``) and A/B files (``reuse-ab-*``) are
not results of the current code and are left out. The table replaces what stands between the
README's ``BEGIN GENERATED`` and ``END GENERATED`` markers; with no results at all it is one line
saying to run ``make bench``. ``SCALE.md`` gets, between the same markers, a table per row
count and vector size from the newest ``scale-<ROWS>[-d<DIMS>]-*.json`` of them that has
per-night figures.
Standard library only::

    python benchmarks/report.py [--results DIR] [--readme PATH] [--scale PATH]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BEGIN = "<!-- BEGIN GENERATED: benchmarks/report.py -->"
END = "<!-- END GENERATED -->"

# <kind>[-<rows>]-<UTC time>.json; bench_cli's results before it took the ``cli-`` prefix are
# named by their time alone (``2026-12-05T093313Z.json``).
_NAME = re.compile(
    r"^(?P<kind>[a-z]+)-(?:(?P<rows>\d+)-)?(?:d(?P<dims>\d+)-)?(?P<stamp>\d{8}T\d{6}Z)\.json$"
)
_BARE_CLI = re.compile(r"^(?P<stamp>\d{4}-\d{2}-\d{2}T\d{6}Z)\.json$")

Result = dict[str, Any]


def newest_results(results: Path) -> dict[str, Path]:
    """The newest results file of each kind in ``results`` (kind -> path)."""
    newest: dict[str, tuple[str, Path]] = {}
    for path in sorted(results.glob("*.json")):
        if match := _NAME.match(path.name):
            kind, stamp = match["kind"], match["stamp"]
        elif match := _BARE_CLI.match(path.name):
            kind, stamp = "cli", match["stamp"].replace("-", "")
        else:
            continue  # a baseline, an A/B file, or a name given with --out
        if kind not in newest or stamp > newest[kind][0]:
            newest[kind] = (stamp, path)
    return {kind: path for kind, (_, path) in newest.items()}


# -- formatting ------------------------------------------------------------------------------


def _n(value: float | None, digits: int = 0) -> str:
    """A number with thousands separators, or ``–`` when absent."""
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def _x(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}×"


def _met(targets: dict[str, Any]) -> str:
    """``k/n met``, naming the targets missed; targets without a verdict are not counted."""
    judged = {
        name: t for name, t in targets.items() if isinstance(t, dict) and t.get("met") is not None
    }
    missed = [name for name, t in judged.items() if not t["met"]]
    text = f"{len(judged) - len(missed)}/{len(judged)} met"
    return text + ("; missed: " + "; ".join(missed) if missed else "")


def _verdict(ok: bool | None) -> str:
    return "–" if ok is None else ("met" if ok else "**missed**")


# -- one summary per bench: (headline figures, targets) ----------------------------------------


def _cli(r: Result) -> tuple[str, str]:
    runs = {run["name"]: run for run in r.get("runs", [])}
    full = runs.get("full", {})
    figures = [
        (
            f"whole file {_n(full.get('wall_s'), 1)} s, "
            f"{_n(full.get('steady_rows_per_s'))} rows/s steady"
        )
    ]
    for name, target in r.get("targets", {}).items():
        if name.startswith("running Prefect server"):
            figures.append(f"SDK loop / embedline {_x(target['value'])} (running server)")
        elif name.startswith("temporary server"):
            figures.append(f"{_x(target['value'])} (temporary server)")
    rss = max((run.get("peak_rss_cli_mb") or 0 for run in runs.values()), default=None)
    figures.append(f"peak RSS {_n(rss)} MB")
    reruns = [run["wall_s"] for name, run in runs.items() if name.startswith("full-rerun")]
    if reruns:
        figures.append(f"reruns ≤ {max(reruns):.1f} s")
    return "; ".join(figures), _met(r.get("targets", {}))


def _reuse(r: Result) -> tuple[str, str]:
    s = r["summary"]
    figures = [
        f"reused / first run CPU {s['reused_cpu_ratio']:.3f}",
        f"10 %-deleted {s['deleted_cpu_ratio']:.3f}",
    ]
    if s.get("server_reused_cpu_ratio") is not None:
        figures.append(f"running server {s['server_reused_cpu_ratio']:.3f}")
    figures += [
        f"S3 reuse {_n(s.get('s3_reuse_rows_per_s'))} rows/s",
        (
            f"peak RSS {_n(s.get('rss_small_mb'))} / {_n(s.get('rss_rows_mb'))} MB "
            f"at {_n(s.get('small_rows'))} / {_n(s.get('rows'))} rows"
        ),
        (
            f"{_n(s.get('vectors_checked'))} vectors checked, "
            f"{_n(s.get('vector_mismatches'))} mismatches"
        ),
    ]
    return "; ".join(figures), _met(r.get("targets", {}))


def _mb(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value / 1e6:,.1f} MB" if value >= 1e5 else f"{value / 1e3:,.1f} KB"


def _scale_checks(r: Result) -> str:
    runs = r["runs"]
    checks = r.get("vector_checks") or {}
    ok = all(c.get("ok") for c in checks.values()) if checks else None
    exits = all(run.get("exit_code") == 0 for run in runs)
    judged = [run for run in runs if run.get("right_inputs") is not None]
    charged = (
        all(run.get("inputs_charged") == run["right_inputs"] for run in judged) if judged else None
    )
    return (
        f"exit 0 everywhere: {_verdict(exits)}; sampled vectors exact: {_verdict(ok)}; "
        f"charged the edited texts: {_verdict(charged)}"
    )


def _scale(r: Result) -> tuple[str, str]:
    if "ratios" not in r:
        return _scale_before_nights(r)
    runs = {run["name"]: run for run in r["runs"]}
    first = runs.get("first", {})
    figures = [
        f"{_n(r['settings']['rows'])} rows at {_n(r['settings'].get('dims', 64))} dimensions; "
        f"first {_mb(first['written']['total']['bytes'])} "
        f"written, {_n(first.get('task_runs'))} task runs, {_n(first.get('cpu_s'), 1)} CPU s"
    ]
    for name, q in r["ratios"].items():
        figures.append(
            f"{name}: bytes written {_x3(q.get('bytes_written'), 4)}, "
            f"{_n(runs[name].get('task_runs'))} task runs, CPU {_x3(q.get('cpu'))} of the first"
        )
    gc = (r.get("sizes") or {}).get("after_gc", {}).get("output", {}).get("total", {})
    figures.append(f"kept after gc {_mb(gc.get('bytes'))}; per night: [SCALE.md](SCALE.md)")
    return "; ".join(figures), _scale_checks(r)


def _x3(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}×"


def _scale_before_nights(r: Result) -> tuple[str, str]:
    """A scale result without per-night figures: rows/s and charges of each step."""
    runs = {run["name"]: run for run in r["runs"]}
    figures = [f"{_n(r['settings']['rows'])} rows"]
    for name, run in runs.items():
        if name == "gc":
            figures.append(f"gc {_n(run.get('wall_s'), 1)} s")
        elif run.get("rows_per_s"):
            charged = run.get("inputs_charged")
            ideal = run.get("right_inputs")
            charge = (
                (
                    f", {_n(charged)} charged"
                    + (f" (ideal {_n(ideal)})" if ideal is not None else "")
                )
                if charged is not None
                else ""
            )
            figures.append(f"{name} {_n(run['rows_per_s'])} rows/s{charge}")
    rss = max((run.get("peak_rss_cli_mb") or 0 for run in runs.values()), default=None)
    figures.append(f"peak RSS {_n(rss)} MB")
    probe = (r.get("planning") or {}).get("probe") or {}
    if probe.get("cpu_s_per_gb"):
        figures.append(f"planning {probe['cpu_s_per_gb']:.1f} CPU s/GB")
    checks = r.get("vector_checks") or {}
    ok = all(c.get("ok") for c in checks.values()) if checks else None
    exits = all(run.get("exit_code") == 0 for run in runs.values())
    return "; ".join(figures), (
        f"exit 0 everywhere: {_verdict(exits)}; sampled vectors exact: {_verdict(ok)}"
    )


def scale_nights(r: Result) -> str:
    """The per-night table of one scale result (Markdown)."""
    settings = r["settings"]
    lines = [
        f"### {_n(settings['rows'])} rows, {_n(settings.get('dims', 64))} dimensions",
        "",
        f"`{Path(r.get('_file', '')).name}`; {_scale_checks(r)}.",
        "",
        "| night | charged (ideal) | written | objects | kept | task runs | CPU s "
        "embedline | CPU s server | wall s | peak RSS MB | written / first | task runs / "
        "first | CPU / first |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
    ]
    ratios = r.get("ratios") or {}
    for run in r["runs"]:
        if "written" not in run:
            continue
        q = ratios.get(run["name"], {})
        ideal = run.get("right_inputs")
        charged = _n(run.get("inputs_charged")) + (f" ({_n(ideal)})" if ideal is not None else "")
        lines.append(
            f"| {run['name']} | {charged} | {_mb(run['written']['total']['bytes'])} | "
            f"{_n(run['written']['total']['files'])} | {_mb(run.get('kept_bytes'))} | "
            f"{_n(run.get('task_runs'))} | {_n(run.get('cpu_s'), 1)} | "
            f"{_n(run.get('prefect_server_cpu_s'), 1)} | {_n(run.get('wall_s'), 1)} | "
            f"{_n(run.get('peak_rss_cli_mb'))} | {_x3(q.get('bytes_written'), 4)} | "
            f"{_x3(q.get('task_runs'))} | {_x3(q.get('cpu'))} |"
        )
    after = r.get("sizes", {}).get("after_gc", {})
    gc = next((run for run in r["runs"] if run["name"] == "gc"), {})
    if after:
        lines += [
            "",
            f"After `embedline gc {settings.get('gc_args', '')}` ({_n(gc.get('wall_s'), 1)} s): "
            f"the output holds {_mb(after.get('output', {}).get('total', {}).get('bytes'))}; "
            f"the last night's run needs {_mb(after.get('last_night_kept_bytes'))}.",
        ]
    return "\n".join(lines)


def newest_scale(results: Path) -> list[Path]:
    """The newest per-night scale result of each row count and vector size (``d1536`` in
    the name; none: 64), most rows first, then fewest dimensions."""
    newest: dict[tuple[int, int], tuple[str, Path]] = {}
    for path in sorted(results.glob("scale-*.json")):
        match = _NAME.match(path.name)
        if not match or not match["rows"]:
            continue
        shape = (-int(match["rows"]), int(match["dims"] or 64))
        if shape not in newest or match["stamp"] > newest[shape][0]:
            newest[shape] = (match["stamp"], path)
    return [path for _, (_, path) in sorted(newest.items())]


def scale_tables(results: Path) -> str:
    """What goes between SCALE.md's markers: a table per row count with per-night figures."""
    parts = []
    for path in newest_scale(results):
        try:
            r = json.loads(path.read_text())
            if "ratios" not in r:
                continue  # no per-night figures in it
            parts.append(scale_nights({**r, "_file": str(path)}))
        except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
            parts.append(f"`{path.name}`: unreadable results ({type(exc).__name__}: {exc})")
    return "\n\n".join(parts) or "No per-night results yet: run `make bench-scale ROWS=N`."


def _paid(r: Result) -> tuple[str, str]:
    figures = (
        f"{_n(r['inputs_charged'])} inputs charged for {_n(r['distinct_texts'])} distinct "
        f"texts (+{r['extra_pct']:.1f} %) in {len(r['passes'])} passes, "
        f"{r['fail_rate'] * 100:g} % of requests failing"
    )
    return figures, f"at most the distinct texts: {_verdict(r.get('target_met'))}"


def _batch(r: Result) -> tuple[str, str]:
    figures = (
        f"{_n(r['batch_inputs_charged'])} inputs in {_n(r['batches_created'])} batches "
        f"for {_n(r['distinct_texts'])} distinct texts, {r['synchronous_requests']} "
        f"synchronous requests; run {_n(r['wall_s'], 1)} s, rerun "
        f"{_n(r['rerun_wall_s'], 1)} s with {r['rerun_batches_created']} batches"
    )
    return figures, f"`ok`: {_verdict(r.get('ok'))}"


def _changes(r: Result) -> tuple[str, str]:
    figures = []
    for size in r["results"]:
        new, old = size.get("new", {}), size.get("old")
        text = (
            f"{_n(size['rows'])} rows: {new.get('cpu_seconds', 0):.1f} CPU s, peak RSS "
            f"{_n(new.get('peak_rss_mib'))} MiB"
        )
        if old and old.get("peak_rss_mib") and new.get("peak_rss_mib"):
            text += (
                f" (old / new: RSS {_x(old['peak_rss_mib'] / new['peak_rss_mib'])}, "
                f"CPU {_x(old['cpu_seconds'] / new['cpu_seconds'])})"
            )
        figures.append(text)
    same = [size["same_content"] for size in r["results"] if "same_content" in size]
    verdict = _verdict(all(same) if same else None)
    return "; ".join(figures), f"same content as the old diff: {verdict}"


def _load(r: Result) -> tuple[str, str]:
    figures = [
        f"{name}: CLI {_n(s['cli_rows_s'])} rows/s, stage / adapter "
        f"{_x(s['stage_vs_adapter'])}, rerun {s['rerun_already_loaded_wall_s']} s"
        for name, s in r.get("sinks", {}).items()
    ]
    build = r.get("pgvector_index_build")
    if build:
        figures.append(
            f"HNSW build: PostgreSQL defaults / embedline {_x(build['defaults_vs_ours'])}"
        )
    return "; ".join(figures), "–"


def _pgindex(r: Result) -> tuple[str, str]:
    e = r["embedding"]
    builds = "; ".join(
        f"{name} {r['seconds'][name]:.1f} s ({_n(r['rows_per_s'][name])} rows/s)"
        for name in ("defaults", "embedline")
    )
    figures = (
        f"{_n(r['rows'])} × {r['dims']} HNSW build: {builds}; defaults / embedline "
        f"{_x(r['defaults_vs_embedline'])}; embedding at {_n(e['tpm'])} TPM "
        f"({e['tokens_per_row']:g} tokens a row, assumed) {e['seconds']} s"
    )
    return figures, _met(r.get("targets", {}))


def _local(r: Result) -> tuple[str, str]:
    figures, verdicts = [], []
    for base in ("sentence-transformers", "plain"):
        ratios = r.get(f"ratios_vs_{base}")
        if ratios:
            figures.append(
                f"vs {base}: rows/s {_x(ratios['rows_per_s'])}, peak RSS "
                f"{_x(ratios['rss'])}, rows/CPU-s {_x(ratios['rows_per_cpu_s'])}"
            )
            if base == "sentence-transformers":
                verdicts.append(
                    f"rows/s ≥ 1.0×: {_verdict(ratios['rows_per_s'] >= 1.0)}; "
                    f"RSS ≤ 1.2×: {_verdict(ratios['rss'] <= 1.2)}"
                )
    return "; ".join(figures) or "–", "; ".join(verdicts) or "– (needs `--st-python`)"


def _planning(r: Result) -> tuple[str, str]:
    gb = r["bytes"] / 1e9
    v = r["variants"]
    figures = [
        f"{name}: planning {v[name]['plan_s'] / gb:.1f} s/GB, chunk reads "
        f"{v[name]['read_s'] / gb:.1f} s/GB"
        for name in ("new", "old")
        if name in v
    ]
    if "old" in v and "new" in v:
        old, new = (v[name]["plan_s"] + v[name]["read_s"] for name in ("old", "new"))
        figures.append(f"old / new {_x(old / new)}")
    return "; ".join(figures), "–"


def _dask(r: Result) -> tuple[str, str]:
    runs, f = r["runs"], r["figures"]
    rate = {case: _n(run.get("rows_per_s")) for case, run in runs.items()}
    before = (r.get("before") or {}).get("runs", {})
    was = {case: _n(run.get("rows_per_s")) for case, run in before.items()}
    figures = (
        "rows/s at 1 s latency: "
        + ", ".join(f"{case} {rate[case]} (before {was.get(case, '–')})" for case in rate)
        + f"; 2 workers / 1 {_x(f.get('dask2_over_dask1'))}, / threads "
        + f"{_x(f.get('dask2_over_threads'), 3)}; `--rpm` on 2 workers: "
        + f"{f.get('refused_429')} 429s"
    )
    return figures, _met(r["targets"])


def _nights(r: Result) -> tuple[str, str]:
    s, settings = r["summary"], r["settings"]
    night = s["worst_night_over_first"]
    kept = s["kept_after_gc_over_one_copy"]
    figures = (
        f"{_n(settings['rows'])} rows, {settings['nights']} nights of "
        f"{settings['fraction'] * 100:g} % edits at new positions: the largest night wrote "
        f"{night:.4f}× the first run's bytes; after `gc --keep-runs {settings['keep_runs']}` "
        f"{kept:.3f}× one full copy; charged = edited every night: {s['charged_equals_edited']}"
    )
    met = [night <= s["targets"]["night"], kept <= s["targets"]["kept"]]
    return figures, f"{sum(met)}/2 met" + ("" if all(met) else "; missed")


# kind -> (bench script, summary); in the order the README lists the benches
BENCHES: dict[str, tuple[str, Callable[[Result], tuple[str, str]]]] = {
    "cli": ("bench_cli.py", _cli),
    "local": ("bench_local.py", _local),
    "load": ("bench_load.py", _load),
    "pgindex": ("bench_pg_index.py", _pgindex),
    "planning": ("bench_planning.py", _planning),
    "batch": ("bench_batch.py", _batch),
    "paid": ("bench_paid.py", _paid),
    "dask": ("bench_dask.py", _dask),
    "reuse": ("bench_reuse.py", _reuse),
    "scale": ("bench_scale.py", _scale),
    "nights": ("bench_nights.py", _nights),
    "changes": ("bench_changes.py", _changes),
}


def table(results: Path) -> tuple[str, dict[str, Path]]:
    """The Markdown that goes between the markers, and the files it was made from."""
    newest = newest_results(results)
    used = {kind: path for kind, path in newest.items() if kind in BENCHES}
    if not used:
        empty = (
            "No results yet: run `make bench` (and `make bench-scale ROWS=N`), then "
            "`python benchmarks/report.py`."
        )
        return empty, used
    lines = ["| bench | newest results: headline figures | targets |", "| --- | --- | --- |"]
    for kind, (script, summary) in BENCHES.items():
        if kind not in used:
            continue
        try:
            figures, targets = summary(json.loads(used[kind].read_text()))
        except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
            figures, targets = f"unreadable results ({type(exc).__name__}: {exc})", "–"
        lines.append(f"| `{script}` | {figures} | {targets} |")
    missing = [f"`{script}`" for kind, (script, _) in BENCHES.items() if kind not in used]
    if missing:
        lines += ["", "No results file yet for " + ", ".join(missing) + "."]
    return "\n".join(lines), used


def rewrite(readme: Path, generated: str) -> bool:
    """Replace the text between the markers of ``readme``; True if it changed."""
    text = readme.read_text(encoding="utf-8")
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        raise SystemExit(f"report.py: {readme} lacks the markers {BEGIN} … {END}")
    new = text[: start + len(BEGIN)] + "\n" + generated + "\n" + text[stop:]
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return new != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--readme", type=Path, default=HERE / "README.md")
    parser.add_argument("--scale", type=Path, default=HERE / "SCALE.md")
    args = parser.parse_args(argv)
    generated, used = table(args.results)
    for kind, path in used.items():
        print(f"{kind:9} {path.name}")
    for page, text in ((args.readme, generated), (args.scale, scale_tables(args.results))):
        changed = rewrite(page, text)
        print(f"{page}: {'rewritten' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
