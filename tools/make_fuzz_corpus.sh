#!/usr/bin/env bash
# Seed corpora for the fuzz targets (tests/fuzz/fuzz_*.cpp), derived from the
# real files (the embedded stories260K, and the test data's models/:
# $RUNLM_TEST_DATA, default ../shared) and from tiny models written by
# make_random_model, into BUILD/corpus/TARGET/. Nothing large is committed:
# only tests/fuzz/seeds/ (a few hand-written inputs) is copied as it is.
#
#   tools/make_fuzz_corpus.sh [BUILD]      (default build-fuzz; needs BUILD/make_random_model)
#
# libFuzzer adds what it finds to the same directories, so a corpus grows
# from one run to the next; the seeds are rewritten each time.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-fuzz}
OUT=$BUILD/corpus
# One folder of model files: the embedded stories260K beside links to the
# test data's models (those seeds are left out when it is absent).
DATA=${RUNLM_TEST_DATA:-../shared}
MODELS=$BUILD/seed-models
mkdir -p "$MODELS"
ln -sfn "$PWD"/models/stories260K/* "$MODELS/"
if [ -d "$DATA/models" ]; then
  for f in "$DATA"/models/*; do
    [ -e "$MODELS/$(basename "$f")" ] || ln -s "$(realpath "$f")" "$MODELS/"
  done
fi
TARGETS="fuzz_gguf fuzz_safetensors fuzz_hf_config fuzz_tokenizer fuzz_bpe_tokenizer fuzz_chat_template fuzz_batch_input fuzz_jinja"
for t in $TARGETS; do
  mkdir -p "$OUT/$t"
  if [ -d "tests/fuzz/seeds/$t" ]; then cp tests/fuzz/seeds/"$t"/* "$OUT/$t/"; fi
done

# Jinja: the real chat templates in ../shared/templates and the built-in ones.
for f in ../shared/templates/*.jinja src/chat_templates/*.jinja; do
  [ -f "$f" ] && cp "$f" "$OUT/fuzz_jinja/"
done

# GGUF: tiny writer-produced models (every weight type the writer makes, a
# GQA and a Mistral-style sliding-window variant) with the stories260K
# vocabulary, so mutations reach the model loader, the tokenizer and the
# forward pass. Dims of 32 keep them under 200 KB (run_fuzz.sh's -max_len
# for this target); K-quant rows need 256, so those types fall back to
# q8_0 here and are left to tests/test_quant.cpp.
MRM=$BUILD/make_random_model
if [ -x "$MRM" ]; then
  for type in f32 f16 bf16 q8_0 q4_0 q4_k q6_k; do
    ASAN_OPTIONS=detect_leaks=0 "$MRM" --preset tiny --dim 32 --hidden 64 --layers 1 --heads 4 --kv-heads 2 \
      --ctx 64 --type "$type" --threads 1 --tokenizer "$MODELS/stories260K-tok512.model" \
      -o "$OUT/fuzz_gguf/tiny-$type.gguf" > /dev/null 2>&1
  done
  ASAN_OPTIONS=detect_leaks=0 "$MRM" --preset tiny --dim 32 --hidden 64 --layers 2 --heads 2 --kv-heads 1 \
    --ctx 64 --sliding-window 8 --type q8_0 --threads 1 --tokenizer "$MODELS/stories260K-tok512.model" \
    -o "$OUT/fuzz_gguf/tiny-swa.gguf" > /dev/null 2>&1
else
  echo "make_fuzz_corpus: $MRM not built; GGUF seeds from the shared files only" >&2
fi

python3 - "$MODELS" "$OUT" <<'PY'
import json, os, struct, sys

models, out = sys.argv[1], sys.argv[2]

def write(target, name, data):
    with open(os.path.join(out, target, name), "wb") as f:
        f.write(data)

# ---- GGUF: the real stories260K header, and its vocabulary alone -----------
raw = open(os.path.join(models, "stories260K.gguf"), "rb").read()
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

def skip_value(b, pos, t):
    if t in SCALAR:
        return pos + SCALAR[t]
    if t == 8:
        (n,) = struct.unpack_from("<Q", b, pos)
        return pos + 8 + n
    if t == 9:
        et, n = struct.unpack_from("<IQ", b, pos)
        pos += 12
        for _ in range(n):
            pos = skip_value(b, pos, et)
        return pos
    raise ValueError(t)

n_tensors, n_kv = struct.unpack_from("<QQ", raw, 8)
pos = 24
for _ in range(n_kv):
    (klen,) = struct.unpack_from("<Q", raw, pos)
    pos += 8 + klen
    (t,) = struct.unpack_from("<I", raw, pos)
    pos = skip_value(raw, pos + 4, t)
kv_end = pos
# Metadata and tensor infos, no data: the reader must refuse the offsets.
write("fuzz_gguf", "stories260K-header.gguf", raw[:14176])
# The same metadata as a vocabulary-only file (0 tensors), like ggml-vocab-*.gguf.
write("fuzz_gguf", "stories260K-vocab.gguf", raw[:8] + struct.pack("<QQ", 0, n_kv) + raw[24:kv_end])

# ---- safetensors: small valid files with sotu29m's names and bytes ----------
shard = os.path.join(models, "sotu29m", "model-00001-of-00004.safetensors")
sb = open(shard, "rb").read(1 << 20)
(hlen,) = struct.unpack_from("<Q", sb, 0)
header = json.loads(sb[8:8 + hlen])
write("fuzz_safetensors", "sotu29m-shard1-header-only.safetensors", sb[:8 + hlen])
names = [k for k in header if k != "__metadata__"][:4]
src = sb[8 + hlen:]
for dtype, size in (("BF16", 2), ("F16", 2), ("F32", 4)):
    hdr, blob = {"__metadata__": {"format": "pt"}}, b""
    for i, name in enumerate(names):
        shape = [2, 4] if i % 2 == 0 else [4]
        n = 1
        for d in shape:
            n *= d
        nbytes = n * size
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + nbytes]}
        blob += src[:nbytes]
    h = json.dumps(hdr).encode()
    write("fuzz_safetensors", "small-%s.safetensors" % dtype.lower(), struct.pack("<Q", len(h)) + h + blob)
h = b"{}"
write("fuzz_safetensors", "empty.safetensors", struct.pack("<Q", len(h)) + h)

# ---- config.json -------------------------------------------------------------
write("fuzz_hf_config", "sotu29m-config.json", open(os.path.join(models, "sotu29m", "config.json"), "rb").read())

# ---- tokenizer: llama.cpp's tokenizer test strings, every vocabulary and mode
inp = open(os.path.join(models, "ggml-vocab-llama-spm.gguf.inp"), "rb").read()
for i, s in enumerate(inp.split(b"\n__ggml_vocab_test__\n")):
    for flags in (0x0, 0x1, 0x2, 0x4 | 0x8 | (i % 3)):
        write("fuzz_tokenizer", "vocab-test-%02d-%x" % (i, flags), bytes([flags]) + s)

# ---- BPE tokenizer: llama.cpp's test strings of the byte-level vocabularies
# (byte 0: vocabulary in bits 0-1, parse_special, add_bos, literal range)
for v, name in enumerate(("qwen2", "llama-bpe", "gpt-2")):
    path = os.path.join(models, "..", "vocab", "ggml-vocab-%s.gguf.inp" % name)
    if not os.path.exists(path):
        continue
    for i, s in enumerate(open(path, "rb").read().split(b"\n__ggml_vocab_test__\n")):
        for flags in (v, v | 0x4, v | 0x4 | 0x8 | 0x10):
            write("fuzz_bpe_tokenizer", "vocab-test-%s-%02d-%x" % (name, i, flags), bytes([flags]) + s)
for v in range(3):
    write("fuzz_bpe_tokenizer", "specials-%d" % v, bytes([v | 0x4 | 0x10]) +
          b"<|im_start|>user\nhi<|im_end|><|begin_of_text|><|eot_id|><|endoftext|>[PAD151646]")

# ---- chat templates: the golden conversations, in the target's encoding -----
cases = json.load(open("tests/data/chat_templates/cases.json"))["cases"]
roles = {"system": 0, "user": 1, "assistant": 2}
for t in range(5):
    for name, case in cases.items():
        flags = t | (8 if case.get("add_generation_prompt") else 0)
        body = b"\0".join(bytes([roles.get(m["role"], 3)]) + m["content"].encode() for m in case["messages"])
        write("fuzz_chat_template", "case-%d-%s" % (t, name), bytes([flags]) + body)
for jinja in sorted(os.listdir("tests/data/chat_templates")):
    if jinja.endswith(".jinja"):
        write("fuzz_chat_template", "detect-" + jinja, b"\x05" + open(os.path.join("tests/data/chat_templates", jinja), "rb").read())

# ---- batch requests: the tokenizer test strings as prompts (text and JSONL)
# and the golden conversations as "messages" requests; byte 0 bit 0 picks
# the .jsonl file name (see fuzz_batch_input.cpp).
strings = [s.decode("utf-8", "replace") for s in inp.split(b"\n__ggml_vocab_test__\n")]
lines = [json.dumps({"id": i, "prompt": s, "n_predict": 8 + i, "temperature": 0.1 * (i % 10), "seed": i}, ensure_ascii=i % 2 == 0)
         for i, s in enumerate(strings)]
write("fuzz_batch_input", "vocab-prompts.jsonl", b"\x01" + "\n".join(lines).encode())
write("fuzz_batch_input", "vocab-prompts.txt", b"\x00" + "\n".join(s.replace("\n", " ") for s in strings).encode())
chats = [json.dumps({"id": name, "messages": case["messages"], "stop": ["\n\n", "</s>"]}) for name, case in cases.items()]
write("fuzz_batch_input", "chat-cases.jsonl", b"\x00" + "\n".join(chats).encode())
PY

for t in $TARGETS; do
  echo "corpus $t: $(ls "$OUT/$t" | wc -l) files, $(cat "$OUT/$t"/* | wc -c) bytes"
done
