#!/usr/bin/env python3
"""Compares `runlm quantize` with llama.cpp's llama-quantize, mix by mix.

Makes a random F16 llama model (tools/make_random_model; rows are whole
256-element blocks), quantizes it with both programs into each mix, and
compares the two files tensor by tensor: the type of every tensor, and
whether the bytes are the same (both run ggml's reference quantizers without
an importance matrix, so they should be). With --ppl it also runs
`runlm perplexity --ppl-mode llama --device cpu` and llama-perplexity on the
same text and chunk count, for each llama-quantize file and for runlm's file
of the same mix, and prints the perplexities and relative differences. With
--decoded it also re-encodes each llama-quantize file as f32 (`runlm quantize
Q D f32 --allow-requantize`: the weights as decoded) and runs both programs on
that file too. runlm gives the same perplexity on Q and D (it multiplies the
decoded weights in f32); where llama.cpp agrees with runlm on D but not on Q,
the difference on Q is llama.cpp's CPU dot products, which round the
activations to 8 bits (Q8_0/Q8_K blocks) against quantized weights.

  tools/compare_quantize.py --llama-bin /path/llama.cpp-build/bin \
      --runlm build-cpu/runlm --make-random-model build-cpu/make_random_model \
      --tokenizer ../shared/models/llama2-tokenizer.model [--ppl TEXT [--decoded]] [--mixes q4_k_m,q3_k_m]

Needs only Python 3 (no numpy). Not a CI test: CI has no llama.cpp.
"""
import argparse
import os
import re
import struct
import subprocess
import sys
import tempfile

MIXES = ["q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k", "q8_0",
         "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "iq4_xs", "mxfp4_moe"]

# ggml type id -> (name, block size, bytes per block)
TYPES = {0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20), 6: ("q5_0", 32, 22),
         7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34), 10: ("q2_k", 256, 84), 11: ("q3_k", 256, 110),
         12: ("q4_k", 256, 144), 13: ("q5_k", 256, 176), 14: ("q6_k", 256, 210), 20: ("iq4_nl", 32, 18),
         23: ("iq4_xs", 256, 136), 30: ("bf16", 1, 2), 39: ("mxfp4", 32, 17)}


def read_gguf(path):
    """Returns {tensor name: (type name, bytes)} of a GGUF v2/v3 file."""
    with open(path, "rb") as f:
        data = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        vals = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return vals if len(vals) > 1 else vals[0]

    def take_str():
        nonlocal pos
        n = take("Q")
        s = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def take_value(vtype):
        if vtype == 8:
            return take_str()
        if vtype == 9:
            etype, n = take("I"), take("Q")
            return [take_value(etype) for _ in range(n)]
        return take(scalar[vtype])

    magic, version = take("4sI")
    assert magic == b"GGUF", path
    n_tensors, n_kv = take("QQ")
    kv = {}
    for _ in range(n_kv):
        key = take_str()
        kv[key] = take_value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = take_str()
        n_dims = take("I")
        ne = [take("Q") for _ in range(n_dims)]
        ttype, offset = take("I"), take("Q")
        infos.append((name, ne, ttype, offset))
    align = kv.get("general.alignment", 32)
    base = (pos + align - 1) // align * align
    out = {}
    for name, ne, ttype, offset in infos:
        tname, block, size = TYPES[ttype]
        n = 1
        for d in ne:
            n *= d
        nbytes = n // block * size
        out[name] = (tname, data[base + offset:base + offset + nbytes])
    return out, kv


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout + r.stderr


def compare(llama_path, runlm_path):
    a, _ = read_gguf(llama_path)
    b, _ = read_gguf(runlm_path)
    assert set(a) == set(b), (set(a) ^ set(b))
    same_type = same_bytes = 0
    diffs = []
    for name in sorted(a):
        (ta, da), (tb, db) = a[name], b[name]
        if ta == tb:
            same_type += 1
            if da == db:
                same_bytes += 1
            else:
                nd = sum(x != y for x, y in zip(da, db))
                diffs.append(f"{name} {ta}: {nd} of {len(da)} bytes differ")
        else:
            diffs.append(f"{name}: llama.cpp {ta}, runlm {tb}")
    types = {}
    for name, (t, _) in a.items():
        types[t] = types.get(t, 0) + 1
    return len(a), same_type, same_bytes, diffs, types


def ppl_runlm(runlm, model, text, ctx, chunks, threads):
    out = run([runlm, "perplexity", "-m", model, "-f", text, "--ppl-mode", "llama", "--device", "cpu", "-c", str(ctx),
               "--chunks", str(chunks), "-t", str(threads)])
    return float(re.search(r"Final estimate: PPL = ([0-9.]+)", out).group(1))


def ppl_llama(bindir, model, text, ctx, chunks, threads):
    out = run([os.path.join(bindir, "llama-perplexity"), "-m", model, "-f", text, "-c", str(ctx), "--chunks",
               str(chunks), "-fa", "off", "-ctk", "f32", "-ctv", "f32", "-nr", "-t", str(threads)])
    return float(re.search(r"Final estimate: PPL = ([0-9.]+)", out).group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bin", required=True, help="directory with llama-quantize (and llama-perplexity)")
    ap.add_argument("--runlm", default="build-cpu/runlm")
    ap.add_argument("--make-random-model", default="build-cpu/make_random_model")
    ap.add_argument("--tokenizer", default="../shared/models/llama2-tokenizer.model")
    ap.add_argument("--model", help="an F16 GGUF to use instead of a random one")
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--work", help="directory for the files (default: a temporary one)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ppl", metavar="TEXT", help="also compare perplexities on this text")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--decoded", action="store_true",
                    help="with --ppl: also compare both programs on each llama-quantize file decoded to f32")
    args = ap.parse_args()

    work = args.work or tempfile.mkdtemp(prefix="compare_quantize_")
    os.makedirs(work, exist_ok=True)
    src = args.model
    if not src:
        src = os.path.join(work, "random-f16.gguf")
        if not os.path.exists(src):
            run([args.make_random_model, "--preset", "tiny", "--type", "f16", "--dim", "512", "--hidden", "1536",
                 "--layers", "8", "--heads", "8", "--kv-heads", "2", "--ctx", "512", "--tokenizer", args.tokenizer,
                 "-o", src])
    print(f"source: {src}")

    rows = []
    ok = True
    for mix in args.mixes.split(","):
        lq = os.path.join(work, f"llama-{mix}.gguf")
        rq = os.path.join(work, f"runlm-{mix}.gguf")
        run([os.path.join(args.llama_bin, "llama-quantize"), src, lq, mix.upper(), str(args.threads)])
        run([args.runlm, "quantize", src, rq, mix, "-t", str(args.threads)])
        n, same_type, same_bytes, diffs, types = compare(lq, rq)
        ok = ok and not diffs
        mixdesc = ", ".join(f"{c} {t}" for t, c in sorted(types.items()))
        print(f"{mix:10s} {n} tensors: same type {same_type}, same bytes {same_bytes}   [{mixdesc}]")
        for d in diffs[:10]:
            print("    " + d)
        rows.append((mix, lq, rq))

    if args.ppl:
        def ppls(model):
            pl = ppl_llama(args.llama_bin, model, args.ppl, args.ctx, args.chunks, args.threads)
            pr = ppl_runlm(args.runlm, model, args.ppl, args.ctx, args.chunks, args.threads)
            return pl, pr, f"{pl:.4f} | {pr:.4f} | {(pr - pl) / pl:+.2e}"

        print(f"\nperplexity, -c {args.ctx}, {args.chunks} chunks of {args.ppl}")
        decoded_cols = " llama.cpp, decoded | runlm, decoded | relative difference |" if args.decoded else ""
        print(f"| file | llama.cpp PPL | runlm PPL | relative difference |{decoded_cols}")
        print("|---|---|---|---|" + "---|---|---|" * args.decoded)
        cases = [("f16", src, None)] + [(m, lq, rq) for m, lq, rq in rows]
        for mix, lq, rq in cases:
            pl, _, cols = ppls(lq)
            if args.decoded and mix != "f16":
                dq = os.path.join(work, f"llama-{mix}-decoded.gguf")
                run([args.runlm, "quantize", lq, dq, "f32", "--allow-requantize", "-t", str(args.threads)])
                cols += " | " + ppls(dq)[2]
            elif args.decoded:
                cols += " | | |"
            print(f"| {mix} (llama-quantize) | {cols} |")
            if rq:
                prr = ppl_runlm(args.runlm, rq, args.ppl, args.ctx, args.chunks, args.threads)
                pad = " | | |" * args.decoded
                print(f"| {mix} (runlm quantize) | {pl:.4f} | {prr:.4f} | {(prr - pl) / pl:+.2e}{pad} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
