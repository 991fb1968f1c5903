#!/usr/bin/env python3
"""FlashAttention-paper-style bar charts from bench-attn JSON and the torch anchors.

One PNG per (head dim, causal mode): TFLOP/s against sequence length, one bar
per backend (ours: naive/fa2/fa3; torch: cudnn, flash). Needs matplotlib
(Debian's python3-matplotlib, or the GPU machine's python3).

  tools/plot_attn.py gpu-check-out/bench_attn.jsonl gpu-check-out/anchors.jsonl -o plots/
"""
import argparse
import json
import os
import sys


def rows(path):
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                yield json.loads(line)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench", help="bench-attn -o json output")
    p.add_argument("anchors", nargs="?", help="torch_sdpa.py prefill output (optional)")
    p.add_argument("-o", "--outdir", default=".")
    args = p.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_attn.py: matplotlib is not installed (apt-get install python3-matplotlib)")

    data = {}  # (hdim, causal) -> {series: {seqlen: tflops}}
    gpu = ""
    for r in rows(args.bench):
        if r.get("status") != "ok":
            continue
        gpu = r.get("gpu", gpu)
        key = (r["hdim"], bool(r["causal"]))
        data.setdefault(key, {}).setdefault("runlm " + r["backend"], {})[r["seqlen"]] = r["TFLOPs"]
    if args.anchors:
        for r in rows(args.anchors):
            if r.get("what") != "prefill":
                continue
            key = (r["hdim"], bool(r["causal"]))
            for name in ("cudnn", "flash"):
                v = r.get(name + "_TFLOPs")
                if v is not None:
                    data.setdefault(key, {}).setdefault("torch " + name, {})[r["seqlen"]] = v
    os.makedirs(args.outdir, exist_ok=True)
    for (hdim, causal), series in sorted(data.items()):
        seqlens = sorted({s for v in series.values() for s in v})
        names = sorted(series)
        width = 0.8 / max(1, len(names))
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for i, name in enumerate(names):
            xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(seqlens))]
            ys = [series[name].get(s, 0) for s in seqlens]
            bars = ax.bar(xs, ys, width, label=name)
            ax.bar_label(bars, labels=["%.0f" % y if y else "" for y in ys], fontsize=7)
        ax.set_xticks(range(len(seqlens)))
        ax.set_xticklabels(["%dk" % (s // 1024) if s >= 1024 else str(s) for s in seqlens])
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.set_title("Attention forward, head dim %d, %s, bf16 (%s)" % (hdim, "causal" if causal else "non-causal", gpu))
        ax.legend(fontsize=8)
        path = os.path.join(args.outdir, "attn_d%d_%s.png" % (hdim, "causal" if causal else "noncausal"))
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        print(path)


if __name__ == "__main__":
    main()
