#!/usr/bin/env python3
"""Torch SDPA decode anchor for runlm bench-decode.

Times torch.nn.functional.scaled_dot_product_attention on contiguous KV for
the decode sweep shapes: q [B, 32, 1, 128], k/v [B, 8, L, 128] with
enable_gqa=True (or expanded to 32 heads where a backend needs it), per SDPA
backend (cuDNN, flash, efficient), f16 and bf16. Effective bandwidth counts
K and V once at the GQA size, as runlm's bench does:
bytes = 2 * B * L * n_kv * hd * 2. Prints one JSON object per line.

With --merge FILE (runlm's bench output, JSON lines), prints the comparison
table: runlm paged / contiguous GB/s, their ratio, the fraction of the copy
bandwidth and the ratio to cuDNN.
"""
import argparse
import json
import math
import sys


def bench_sdpa(args):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    dev = "cuda"
    n_heads, n_kv, hd = 32, 8, 128
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    # Copy bandwidth, counting read + write, as the C++ bench does.
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    times = []
    for _ in range(9):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    times.sort()
    copy_gbps = 2 * (1 << 30) / (times[len(times) // 2] * 1e-3) / 1e9
    print(json.dumps({"bench": "copy_torch", "gbps": round(copy_gbps, 1)}), flush=True)
    del a, b
    torch.cuda.empty_cache()

    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16}
    for dname in args.dtypes.split(","):
        dt = dtypes[dname]
        for B in [int(x) for x in args.batches.split(",")]:
            for L in [int(x) for x in args.ctxs.split(",")]:
                kv_bytes = 2 * B * L * n_kv * hd * 2
                # Several KV sets so small problems do not run from L2.
                n_rot = max(1, min(8, math.ceil(256e6 / kv_bytes)))
                if kv_bytes * n_rot > args.max_gib * (1 << 30):
                    print(json.dumps({"bench": "sdpa", "B": B, "L": L, "dtype": dname, "skipped": "memory"}),
                          flush=True)
                    continue
                g = torch.Generator(device=dev).manual_seed(B * 1000 + L)
                qs = [torch.randn(B, n_heads, 1, hd, device=dev, dtype=dt, generator=g) for _ in range(n_rot)]
                ks = [torch.randn(B, n_kv, L, hd, device=dev, dtype=dt, generator=g) for _ in range(n_rot)]
                vs = [torch.randn(B, n_kv, L, hd, device=dev, dtype=dt, generator=g) for _ in range(n_rot)]
                for bname, be in backends.items():
                    rec = {"bench": "sdpa", "impl": "torch_" + bname, "B": B, "L": L, "dtype": dname}
                    mode = "gqa"
                    try:
                        with sdpa_kernel([be]):
                            def call(i, mode):
                                if mode == "gqa":
                                    return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=True)
                                return F.scaled_dot_product_attention(qs[i], kx[i], vx[i])
                            kx = vx = None
                            try:
                                call(0, "gqa")
                            except RuntimeError:
                                # Backend without GQA: expand K/V to 32 heads (it then reads 4x the bytes).
                                if kv_bytes * 4 * n_rot > args.max_gib * (1 << 30):
                                    raise
                                mode = "expand"
                                kx = [k.repeat_interleave(n_heads // n_kv, dim=1) for k in ks]
                                vx = [v.repeat_interleave(n_heads // n_kv, dim=1) for v in vs]
                                call(0, mode)
                            for i in range(n_rot):
                                call(i, mode)
                            torch.cuda.synchronize()
                            iters = max(n_rot, 20 // n_rot * n_rot)
                            ts = []
                            for _ in range(7):
                                e0 = torch.cuda.Event(enable_timing=True)
                                e1 = torch.cuda.Event(enable_timing=True)
                                e0.record()
                                for it in range(iters):
                                    call(it % n_rot, mode)
                                e1.record()
                                e1.synchronize()
                                ts.append(e0.elapsed_time(e1) / iters)
                            ts.sort()
                            t = ts[len(ts) // 2] * 1e-3
                            rec.update({"mode": mode, "us": round(t * 1e6, 2), "gbps": round(kv_bytes / t / 1e9, 1),
                                        "frac_copy": round(kv_bytes / t / 1e9 / copy_gbps, 3)})
                            del kx, vx
                    except Exception as e:  # noqa: BLE001 -- report the backend's refusal and go on
                        rec["error"] = str(e).splitlines()[0][:160]
                    print(json.dumps(rec), flush=True)
                del qs, ks, vs
                torch.cuda.empty_cache()


def merge(args):
    runlm, torch_rows, copy = {}, {}, None
    for path in args.merge:
        for line in open(path):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if r.get("bench") == "copy":
                copy = r["gbps"]
            elif r.get("bench") == "paged_decode":
                runlm[(r["B"], r["L"], r["layout"])] = r
            elif r.get("bench") == "sdpa" and "gbps" in r and r.get("dtype") == "f16":
                torch_rows[(r["B"], r["L"], r["impl"])] = r
    print(f"\npaged decode, GQA 32/8, hd 128, f16, page 16 (GB/s of K+V; copy {copy} GB/s)")
    hdr = f"{'B':>4} {'L':>6} {'paged':>8} {'contig':>8} {'pg/ct':>6} {'pg/copy':>7} {'cudnn':>8} {'flash':>8} {'pg/cudnn':>8}"
    print(hdr)
    for (B, L, layout) in sorted(k for k in runlm if k[2] == "paged"):
        pg = runlm[(B, L, "paged")]["gbps"]
        ct = runlm.get((B, L, "contig"), {}).get("gbps", float("nan"))
        cu = torch_rows.get((B, L, "torch_cudnn"), {}).get("gbps", float("nan"))
        fl = torch_rows.get((B, L, "torch_flash"), {}).get("gbps", float("nan"))
        frac = pg / copy if copy else float("nan")
        print(f"{B:>4} {L:>6} {pg:>8.1f} {ct:>8.1f} {pg / ct:>6.3f} {frac:>7.3f} {cu:>8.1f} {fl:>8.1f} {pg / cu:>8.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--ctxs", default="512,2048,8192,32768")
    ap.add_argument("--dtypes", default="f16,bf16")
    ap.add_argument("--max-gib", type=float, default=40.0, help="skip shapes whose KV sets exceed this")
    ap.add_argument("--merge", nargs="+", help="JSON-lines files (runlm bench + this script's output): print the table")
    args = ap.parse_args()
    if args.merge:
        merge(args)
    else:
        bench_sdpa(args)


if __name__ == "__main__":
    sys.exit(main())
