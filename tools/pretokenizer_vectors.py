#!/usr/bin/env python3
"""Writes tests/data/pretokenizers: llama.cpp's token ids for random mixed-script
texts under every BPE pre-tokenizer runlm names, with GPT-2's vocabulary and
merges (tokenizer.ggml.pre set to each name). The shared vocabularies come
with llama.cpp's vectors for their own pre-tokenizer only; these cover the
others (gpt-4o for gpt-oss, tekken for Mistral Nemo, ...) against the same
reference, llama-tokenize.

  tools/pretokenizer_vectors.py --llama-bin /path/llama.cpp-build/bin [--data ../shared]

Needs python3 with numpy (Debian python3-numpy) for llama.cpp's gguf-py,
which it takes from the converter archive in DATA/anchors. Not a CI step:
CI has no llama.cpp; the test reads the files this writes.
"""
import argparse
import os
import random
import subprocess
import sys
import tarfile
import tempfile

# One name of every group runlm's table (src/bpe_pretokenizer.cpp) gives one
# set of regexes and flags, plus a few aliases.
PRES = ["default", "gpt-2", "llama-bpe", "dbrx", "qwen2", "qwen35", "megrez", "deepseek-llm", "deepseek-coder",
        "deepseek-v3", "falcon", "trillion", "starcoder", "refact", "smollm", "poro-chat", "bloom", "viking", "tekken",
        "gpt-4o"]
SEP = "\n__ggml_vocab_test__\n"

# Pieces that pre-tokenizer regexes treat differently: case runs, contractions
# in both cases, digit runs, whitespace kinds, punctuation, scripts with and
# without case, combining marks, emoji sequences and special-token texts.
ATOMS = ["the", "The", "THE", "HelloWORLD", "camelCase", "iPhone", "McDonald", "x", "A", "z",
         "'s", "'S", "'t", "'re", "'VE", "'m", "'ll", "'D", "n't", "don't", "I'm", "it's",
         "0", "7", "42", "123", "1234", "12345678", "3.14", "1,000", "2026-11-28", "v2",
         " ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\r\n", "\u00a0", "\u3000",
         ",", ".", "!", "?", "...", "--", "->", "=>", "(", ")", "[", "]", "{", "}", "<", ">", "/", "\\", "\"", "'",
         "`", "@", "#", "$", "%", "^", "&", "*", "_", "+", "=", "|", "~", ";", ":",
         "é", "É", "ß", "ñ", "Ω", "ω", "Ж", "жизнь", "Привет", "ελληνικά", "עברית", "العربية", "हिन्दी",
         "世界", "你好", "日本語", "カタカナ", "ひらがな", "한국어", "ไทย",
         "😀", "👍🏽", "🇫🇷", "👨‍👩‍👧", "∑", "√", "∞", "№", "½", "²", "Ⅻ",
         "e\u0301", "a\u0308", "\u200b", "\u200d", "<|endoftext|>", "<s>", "</s>"]


def texts(n=160, seed=20261128):
    rng = random.Random(seed)
    return ["".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 14))) for _ in range(n)]


def vocab_with_pre(gguf, src, pre, out):
    """GPT-2's vocabulary GGUF with tokenizer.ggml.pre = pre."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(out, arch=bytes(r.fields["general.architecture"].parts[-1]).decode())
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        t = f.types[0]
        if f.name == "tokenizer.ggml.pre":
            w.add_string(f.name, pre)
        elif t == gguf.GGUFValueType.ARRAY and f.types[1] == gguf.GGUFValueType.STRING:
            w.add_array(f.name, [bytes(f.parts[i]).decode("utf-8", errors="surrogateescape") for i in f.data])
        elif t == gguf.GGUFValueType.ARRAY:
            w.add_array(f.name, [f.parts[i].tolist()[0] for i in f.data])
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(f.name, bytes(f.parts[f.data[0]]).decode())
        else:
            w.add_key_value(f.name, f.parts[f.data[0]].tolist()[0], t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bin", required=True, help="directory with llama-tokenize")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "pretokenizers"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="pretokenizer_vectors_")
    with tarfile.open(os.path.join(args.data, "anchors", "llama.cpp-convert-2026-09-28.txz")) as tar:
        tar.extractall(work, members=[m for m in tar.getmembers() if m.name.startswith("gguf-py")])
    sys.path.insert(0, os.path.join(work, "gguf-py"))
    import gguf

    os.makedirs(args.out, exist_ok=True)
    cases = texts()
    with open(os.path.join(args.out, "random.inp"), "w", encoding="utf-8", newline="") as f:
        f.write(SEP.join(cases))
    src = os.path.join(args.data, "vocab", "ggml-vocab-gpt-2.gguf")
    text_file = os.path.join(work, "text.txt")
    for pre in PRES:
        vocab = os.path.join(work, f"gpt2-{pre}.gguf")
        vocab_with_pre(gguf, src, pre, vocab)
        lines = []
        for t in cases:
            with open(text_file, "w", encoding="utf-8", newline="") as f:
                f.write(t)
            r = subprocess.run([os.path.join(args.llama_bin, "llama-tokenize"), "-m", vocab, "-f", text_file, "--ids",
                                "--log-disable", "--no-bos", "--no-parse-special"], capture_output=True, text=True,
                               check=True)
            ids = r.stdout.strip().splitlines()[-1]
            lines.append(" ".join(ids.strip("[]").replace(",", " ").split()))
        with open(os.path.join(args.out, f"gpt2-{pre}.out"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{pre}: {len(lines)} texts")


if __name__ == "__main__":
    main()
