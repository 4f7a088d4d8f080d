#!/usr/bin/env python3
"""Plots bench_fidelity results (JSON lines) as one SVG, with no plotting library.

    python3 benchmarks/plot_fidelity.py docs/data/fidelity-DATE.jsonl docs/img/fidelity.svg

Left: first-token agreement and exact 24-token greedy agreement on stories260K against
the recompute share r, one line per criterion (r = 0 is shared), and as flat grey lines the
24-token agreement of the no-cache run with a bf16 KV cache and with q8 weights (the floor part).
Right: cached TTFT speedup over
no cache on the speed model against r (log scale).
"""
import json
import math
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
out = sys.argv[2]
# The deviation and impact criteria on another layer than the default (1) are series of their own.
for r in rows:
    if r.get("criterion") in ("deviation", "impact") and r.get("select_layer", 1) != 1:
        r["criterion"] = f"{r['criterion']} L{r['select_layer']}"
# The f32 lines (bench_fidelity --precision: the "default" lines, bf16 weights and states, are
# the same prompts at the defaults of a bf16 checkpoint; docs/fidelity.md has them as a table).
fid = [r for r in rows if r.get("bench") == "fidelity" and r.get("precision", "f32") == "f32"]
speed = [r for r in rows if r.get("bench") == "fidelity_speed"]
# The noise floor (bench_fidelity --part floor): no-cache answers under other arithmetic.
floor = [r for r in rows if r.get("bench") == "fidelity_floor"]
criteria = sorted({r["criterion"] for r in fid + speed if r["criterion"] != "none"})

W, H, PAD = 460, 320, 55
colors = {"deviation": "#1f77b4", "boundary": "#d62728", "recent": "#2ca02c",
          "deviation L2": "#9467bd", "deviation L3": "#8c564b", "impact": "#ff7f0e",
          "impact L2": "#e377c2", "impact L3": "#17becf", "attention": "#bcbd22"}
dashes = {"first_token_agreement": "", "exact_24": "6,3", "exact_32": "2,3"}
labels = {"first_token_agreement": "first token", "exact_24": "24-token exact",
          "exact_32": "32-token exact"}


def series(data, criterion, key):
    pts = [(r["recompute"], r[key]) for r in data
           if r["criterion"] in (criterion, "none") and key in r]
    return sorted(pts)


def panel(x0, title, ylabel, ymin, ymax, lines, yticks, log=False):
    s = [f'<g transform="translate({x0},0)">',
         f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    def px(x):
        return PAD + x * (W - PAD - 15)
    def py(y):
        if log:  # y > 0
            share = (math.log10(y) - math.log10(ymin)) / (math.log10(ymax) - math.log10(ymin))
        else:
            share = (y - ymin) / (ymax - ymin)
        return H - PAD - share * (H - PAD - 35)
    s.append(f'<rect x="{PAD}" y="35" width="{W - PAD - 15}" height="{H - PAD - 35}" '
             'fill="none" stroke="#444"/>')
    for t in [0, 0.1, 0.2, 0.3, 0.5, 1.0]:
        s.append(f'<line x1="{px(t)}" y1="{H - PAD}" x2="{px(t)}" y2="{H - PAD + 4}" stroke="#444"/>')
        s.append(f'<text x="{px(t)}" y="{H - PAD + 16}" text-anchor="middle" font-size="11">{t:g}</text>')
    for t in yticks:
        s.append(f'<line x1="{PAD}" y1="{py(t)}" x2="{W - 15}" y2="{py(t)}" stroke="#ddd"/>')
        s.append(f'<text x="{PAD - 5}" y="{py(t) + 4}" text-anchor="end" font-size="11">{t:g}</text>')
    s.append(f'<text x="{W / 2}" y="{H - 15}" text-anchor="middle" font-size="12">'
             'recompute share r</text>')
    s.append(f'<text x="14" y="{H / 2}" text-anchor="middle" font-size="12" '
             f'transform="rotate(-90 14 {H / 2})">{ylabel}</text>')
    legend_y = 50
    for name, pts, color, dash in lines:
        if not pts:
            continue
        path = " ".join(f"{px(x):.1f},{py(min(max(y, ymin), ymax)):.1f}" for x, y in pts)
        s.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2" '
                 f'stroke-dasharray="{dash}"/>')
        for x, y in pts:
            s.append(f'<circle cx="{px(x):.1f}" cy="{py(min(max(y, ymin), ymax)):.1f}" r="2.5" '
                     f'fill="{color}"/>')
        s.append(f'<line x1="{W - 175}" y1="{legend_y + 50}" x2="{W - 150}" y2="{legend_y + 50}" '
                 f'stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>')
        s.append(f'<text x="{W - 145}" y="{legend_y + 54}" font-size="10">{name}</text>')
        legend_y += 14
    s.append("</g>")
    return s


tokens = fid[0]["tokens"] if fid else 32
keys = ["first_token_agreement", "exact_24"]
fid_lines = []
for c in criteria:
    for k in keys:
        fid_lines.append((f"{c}: {labels.get(k, k)}", series(fid, c, k), colors.get(c, "#333"),
                          dashes.get(k, "1,2")))
for f in floor:
    if f["perturbation"] in ("kv bf16", "weights q8"):
        fid_lines.append((f"no cache, {f['perturbation']}: 24-token exact",
                          [(0, f["exact_24"]), (1, f["exact_24"])], "#999", "1,3"))
speedups = [r["speedup"] for r in speed] or [1]
top = max(10, max(speedups) * 1.1)
speed_lines = [(c, series(speed, c, "speedup"), colors.get(c, "#333"), "") for c in criteria]
speed_lines.append(("10x target", [(0, 10), (1, 10)], "#999", "4,4"))
model = speed[0]["shape"] if speed else "synthetic"
cached = speed[0]["cached_tokens"] if speed else 0
fresh = speed[0]["fresh_tokens"] if speed else 0
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{H}" '
       'font-family="sans-serif">', f'<rect width="{2 * W}" height="{H}" fill="white"/>']
svg += panel(0, f"stories260K, {fid[0]['prompts'] if fid else 0} gap prompts",
             "share of prompts agreeing", 0, 1, fid_lines, [0, 0.25, 0.5, 0.75, 0.9, 1])
svg += panel(W, f"{model}: TTFT speedup, {cached} cached + {fresh} fresh",
             "no-cache TTFT / cached TTFT (log)", 1, top, speed_lines,
             [t for t in [1, 2, 5, 10, 20, 50, 100, 200] if t <= top], log=True)
svg.append("</svg>")
open(out, "w").write("\n".join(svg) + "\n")
