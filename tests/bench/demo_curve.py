#!/usr/bin/env python3
"""Held-out accuracy curve of a tandem-local run, as CSV and SVG.

Reads the trainer's log of a run directory (the lines "held-out accuracy at
version V: A (C/N, Ss)") and writes the curve against wall time since the
first evaluation, each raw evaluation next to the smoothed one (the mean of
the last 5 evaluations, as the trainer's progress line shows it):

  python3 tests/bench/demo_curve.py RUN_DIR --csv out.csv --svg out.svg

Several run directories (e.g. one per seed) go on one plot, a colour each,
and into one CSV with a `run` column (the directory's name).
"""

import os

import argparse
import datetime
import re
import sys

LINE = re.compile(r"^(\S+ \S+) I \[trainer\] held-out accuracy at version "
                  r"(\d+): ([0-9.]+) \((\d+)/(\d+)")


def read_curve(run_dir):
    points = []
    with open(f"{run_dir}/logs/trainer.log") as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            stamp = datetime.datetime.strptime(m.group(1),
                                               "%Y-%m-%d %H:%M:%S.%f")
            points.append((stamp, int(m.group(2)), float(m.group(3))))
    if not points:
        sys.exit(f"no held-out evaluations in {run_dir}/logs/trainer.log")
    start = points[0][0]
    return [((t - start).total_seconds(), v, a) for t, v, a in points]


SMOOTHING_WINDOW = 5  # the trainer's kHeldoutSmoothingWindow


def smoothed(curve, window=SMOOTHING_WINDOW):
    """Mean of the last `window` accuracies at each evaluation."""
    out = []
    for i in range(len(curve)):
        last = [a for _, _, a in curve[max(0, i - window + 1):i + 1]]
        out.append(sum(last) / len(last))
    return out


COLOURS = [("#9ecae1", "#1f77b4"), ("#fdae6b", "#e6550d"),
           ("#a1d99b", "#31a354"), ("#bcbddc", "#756bb1")]


def svg(runs, title):
    """`runs`: [(label, curve)]; each run's evaluations thin, its mean of the
    last SMOOTHING_WINDOW thick, in its own colour."""
    width, height, left, bottom, top, right = 640, 360, 56, 40, 30, 16
    points = [p for _, curve in runs for p in curve]
    max_t = max(60.0, max(t for t, _, _ in points))
    lo = min(a for _, _, a in points)
    hi = max(a for _, _, a in points)
    lo = max(0.0, (int(lo * 10) / 10.0))
    hi = min(1.0, (int(hi * 10) + 1) / 10.0)

    def x(t):
        return left + (width - left - right) * t / max_t

    def y(a):
        return height - bottom - (height - bottom - top) * (a - lo) / (hi - lo)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="18" text-anchor="middle" '
           f'font-size="13">{title}</text>']
    steps = 10
    for i in range(steps + 1):
        a = lo + (hi - lo) * i / steps
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{y(a):.1f}" '
                   f'y2="{y(a):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(a) + 4:.1f}" '
                   f'text-anchor="end">{100 * a:.0f}%</text>')
    minute = 60.0
    t = 0.0
    while t <= max_t + 1e-9:
        out.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" '
                   f'y2="{height - bottom}" stroke="#eee"/>')
        out.append(f'<text x="{x(t):.1f}" y="{height - bottom + 16}" '
                   f'text-anchor="middle">{t / 60:.0f}</text>')
        t += minute
    out.append(f'<text x="{(left + width - right) / 2}" y="{height - 6}" '
               f'text-anchor="middle">minutes of RL</text>')
    out.append(f'<text x="14" y="{(top + height - bottom) / 2}" '
               f'text-anchor="middle" transform="rotate(-90 14 '
               f'{(top + height - bottom) / 2})">held-out accuracy '
               f'(greedy)</text>')
    for k, (label, curve) in enumerate(runs):
        thin, thick = COLOURS[k % len(COLOURS)]
        path = " ".join(f"{x(t):.1f},{y(a):.1f}" for t, _, a in curve)
        out.append(f'<polyline fill="none" stroke="{thin}" '
                   f'stroke-width="1" points="{path}"/>')
        mean = smoothed(curve)
        path = " ".join(f"{x(t):.1f},{y(m):.1f}"
                        for (t, _, _), m in zip(curve, mean))
        out.append(f'<polyline fill="none" stroke="{thick}" '
                   f'stroke-width="2.5" points="{path}"/>')
        if len(runs) > 1:
            ly = top + 10 + 16 * k
            out.append(f'<line x1="{width - right - 150}" '
                       f'x2="{width - right - 130}" y1="{ly}" y2="{ly}" '
                       f'stroke="{thick}" stroke-width="2.5"/>')
            out.append(f'<text x="{width - right - 126}" y="{ly + 4}">'
                       f'{label}</text>')
    thin, thick = COLOURS[0]
    out.append(f'<line x1="{left + 10}" x2="{left + 30}" y1="{top + 10}" '
               f'y2="{top + 10}" stroke="{thin}"/>')
    out.append(f'<text x="{left + 34}" y="{top + 14}">each evaluation</text>')
    out.append(f'<line x1="{left + 10}" x2="{left + 30}" y1="{top + 26}" '
               f'y2="{top + 26}" stroke="{thick}" stroke-width="2.5"/>')
    out.append(f'<text x="{left + 34}" y="{top + 30}">mean of the last '
               f'{SMOOTHING_WINDOW}</text>')
    if len(runs) == 1:
        base = runs[0][1][0][2]
        out.append(f'<line x1="{left}" x2="{width - right}" '
                   f'y1="{y(base):.1f}" y2="{y(base):.1f}" stroke="#999" '
                   f'stroke-dasharray="4 3"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def summary(curve):
    first, last = curve[0], curve[-1]
    best = max(curve, key=lambda p: p[2])
    mean = smoothed(curve)
    return (f"{len(curve)} evaluations over {last[0]:.0f} s: "
            f"{100 * first[2]:.1f}% (v {first[1]}) -> {100 * last[2]:.1f}% "
            f"(v {last[1]}, mean of the last {SMOOTHING_WINDOW} "
            f"{100 * mean[-1]:.1f}%); best {100 * best[2]:.1f}% "
            f"(v {best[1]}, {best[0]:.0f} s)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dirs", nargs="+", metavar="run_dir")
    parser.add_argument("--csv")
    parser.add_argument("--svg")
    parser.add_argument("--title", default="tandem-local: held-out accuracy")
    args = parser.parse_args()
    runs = [(os.path.basename(os.path.normpath(d)), read_curve(d))
            for d in args.run_dirs]
    several = len(runs) > 1
    if args.csv:
        with open(args.csv, "w") as f:
            f.write(("run," if several else "") +
                    "seconds,policy_version,heldout_accuracy,"
                    f"heldout_mean_last_{SMOOTHING_WINDOW}\n")
            for label, curve in runs:
                for (t, v, a), m in zip(curve, smoothed(curve)):
                    f.write((f"{label}," if several else "") +
                            f"{t:.1f},{v},{a:.4f},{m:.4f}\n")
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(svg(runs, args.title))
    for label, curve in runs:
        print((f"{label}: " if several else "") + summary(curve))


if __name__ == "__main__":
    main()
