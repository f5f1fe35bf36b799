"""The benchmark's pictures, drawn from results.json alone (so they can be redrawn)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SYSTEM_ORDER = ("plain-sequential", "plain-concurrent", "teola-nopasses", "teola-full")


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_cdf(results: dict[str, Any], path: Path) -> Path:
    plt = _plt()
    apps = list(results["apps"].items())
    cols = min(3, len(apps))
    rows = (len(apps) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, (name, app) in zip(axes.flat, apps):
        for system in app["systems"]:
            xs = sorted(r["latency_s"] for r in app["runs"] if r["system"] == system and "latency_s" in r)
            if not xs:
                continue
            style = "-" if system in SYSTEM_ORDER else ":"
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], style, where="post", label=system,
                    linewidth=1.6 if system in SYSTEM_ORDER else 0.9)
        ax.set_title(app["title"], fontsize=8)
        ax.set_xlabel("latency (s)", fontsize=7)
        ax.set_ylabel("fraction of queries", fontsize=7)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(apps):]:
        ax.axis("off")
    legend: dict[str, Any] = {}  # every system once, from whichever app ran it (an app may have only errors)
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(6, len(legend)), fontsize=7)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def speedup_bars(results: dict[str, Any], path: Path) -> Path:
    """Speedup over plain-sequential of each main system, with the ideal (plain / bound) beside."""
    plt = _plt()
    apps = list(results["apps"].items())
    series = ["plain-concurrent", "teola-nopasses", "teola-full", "ideal (bound)"]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(apps)), 3.6))
    width = 0.8 / len(series)
    for j, label in enumerate(series):
        vals = []
        for _, app in apps:
            base = app["systems"].get("plain-sequential", {}).get("mean_s")
            if label == "ideal (bound)":
                other = app.get("bound_mean_s")
            else:
                other = app["systems"].get(label, {}).get("mean_s")
            vals.append(base / other if base and other else 0.0)
        bars = ax.bar([i + (j - (len(series) - 1) / 2) * width for i in range(len(apps))], vals, width, label=label,
                      hatch="//" if label.startswith("ideal") else None,
                      color="white" if label.startswith("ideal") else None, edgecolor="black", linewidth=0.5)
        ax.bar_label(bars, fmt="%.2f", fontsize=6)
    ax.axhline(1.0, color="grey", linewidth=0.6)
    ax.set_xticks(range(len(apps)), [n for n, _ in apps], fontsize=7, rotation=15)
    ax.set_ylabel("speedup vs plain-sequential (mean)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def gantt(app: dict[str, Any], path: Path) -> Path | None:
    """One question: plain framework's component calls (its own instrumentation) above, the
    Teola run's primitives (the execution timeline) below, on one time axis."""
    g = app.get("gantt")
    if not g or not g.get("teola_spans"):
        return None
    plt = _plt()
    plain = sorted(g.get("plain_events", []), key=lambda e: e[1])
    teola = sorted(g["teola_spans"], key=lambda s: s[4])
    rows = len(plain) + len(teola)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, max(4, 0.2 * rows + 2.5)), sharex=True,
                                   gridspec_kw={"height_ratios": [max(1, len(plain)), max(1, len(teola))]})
    kinds = sorted({e[0] for e in plain} | {s[1] for s in teola})
    colors = {k: plt.cm.tab10(i % 10) for i, k in enumerate(kinds)}
    for row, (kind, start, end) in enumerate(plain):
        ax1.barh(row, max(end - start, 1e-3), left=start, color=colors[kind], edgecolor="black", linewidth=0.3)
    ax1.set_yticks(range(len(plain)), [e[0] for e in plain], fontsize=6)
    ax1.invert_yaxis()
    ax1.set_title(f"plain-sequential: {g['plain_latency_s']:.2f} s (framework's own instrumentation)", fontsize=8)
    first = min(s[3] for s in teola)
    if first > 0.05:  # before the first primitive: framework code outside the graph (e.g. un-traced ingestion)
        teola = [("(outside the graph)", "outside", "", 0.0, 0.0, first)] + teola
        colors["outside"] = (0.75, 0.75, 0.75, 1.0)
    for row, (node, engine, op, ready, start, end) in enumerate(teola):
        if start > ready:
            ax2.barh(row, start - ready, left=ready, color="none", edgecolor="grey", hatch="//", linewidth=0.3)
        ax2.barh(row, max(end - start, 1e-3), left=start, color=colors[engine], edgecolor="black", linewidth=0.3)
    ax2.set_yticks(range(len(teola)), [s[0][:28] for s in teola], fontsize=6)
    ax2.invert_yaxis()
    ax2.set_title(f"teola-full: {g['teola_latency_s']:.2f} s (execution timeline; hatched = queued)", fontsize=8)
    ax2.set_xlabel("seconds since the query started")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[k]) for k in colors]
    ax1.legend(handles, list(colors), fontsize=6, loc="lower right")
    fig.suptitle(f"{app['title']} — one question ({g['query']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
