"""PNG plots of a scaling matrix's results; `neuronrun matrix` runs it after
the cells:

    python -m torchneuron.matrix_plots OUT/results.csv OUT

Writes OUT/efficiency.png (modelled scaling efficiency against ranks, one
line per strategy and model), OUT/breakdown.png (each cell's modelled step:
compute, exposed communication, pipeline bubble) and OUT/memory.png (each
cell's model-state memory and largest resident memory per rank). Cells
that failed are left out; modelled cells (replayed traces) appear in the
first two, marked, and not in the memory plot (they did not run).
"""
import csv
import io
import os
import sys

from .files import write_atomically

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402



def _save(fig, path):
    """The figure as a PNG at `path`, written atomically (never through a
    link planted there)."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    write_atomically(path, png.getvalue())

def _float(row, key):
    try:
        return float(row[key])
    except (KeyError, ValueError):
        return 0.0


def efficiency(rows, out):
    fig, ax = plt.subplots(figsize=(7, 4))
    lines = {}
    for r in rows:
        lines.setdefault((r["strategy"], r["model"]), []).append(
            (int(r["world"]), _float(r, "scaling_efficiency")))
    for (strategy, model), points in sorted(lines.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                label=f"{strategy} / {model}")
    modelled = [r for r in rows if r["status"] == "modelled"]
    if modelled:
        ax.scatter([int(r["world"]) for r in modelled],
                   [_float(r, "scaling_efficiency") for r in modelled], marker="x", s=80,
                   color="black", zorder=3, label="modelled (replayed trace)")
    if any(int(r["world"]) > 16 for r in rows):
        ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks")
    ax.set_ylabel("scaling efficiency (modelled tokens/s per device)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, os.path.join(out, "efficiency.png"))
    plt.close(fig)


def breakdown(rows, out):
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(rows)), 4))
    names = [r["cell"] + (" (modelled)" if r["status"] == "modelled" else "") for r in rows]
    bottom = [0.0] * len(rows)
    for key, label in (("compute_us", "compute"), ("exposed_comm_us", "exposed communication"),
                       ("bubble_us", "pipeline bubble")):
        values = [_float(r, key) for r in rows]
        ax.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("modelled step time (us)")
    ax.tick_params(axis="x", labelrotation=90, labelsize=6)
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, os.path.join(out, "breakdown.png"))
    plt.close(fig)


def memory(rows, out):
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(rows)), 4))
    names = [r["cell"] for r in rows]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [_float(r, "model_state_mib") for r in rows], width=0.4,
           label="model-state memory (device, MiB)")
    ax2 = ax.twinx()
    ax2.bar([i + 0.2 for i in x], [_float(r, "max_rss_mib") for r in rows], width=0.4,
            color="tab:orange", label="max resident memory (host process, MiB)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(names, rotation=90, fontsize=6)
    ax.set_ylabel("model-state MiB per rank")
    ax2.set_ylabel("max RSS MiB per rank")
    fig.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    _save(fig, os.path.join(out, "memory.png"))
    plt.close(fig)


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    with open(argv[1]) as f:
        rows = [r for r in csv.DictReader(f) if r["status"] in ("completed", "modelled")]
    if not rows:
        return 0
    efficiency(rows, argv[2])
    breakdown(rows, argv[2])
    memory([r for r in rows if r["status"] == "completed"] or rows, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
