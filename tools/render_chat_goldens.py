#!/usr/bin/env python3
"""Renders the chat-template goldens the C++ tests compare against.

Templates are rendered the way transformers' apply_chat_template renders them:
jinja2's ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
with the loopcontrols extension, transformers' tojson filter (json.dumps with
ensure_ascii=False, indent, separators, sort_keys), a raise_exception global
that raises TemplateError, a strftime_now global, and the variables messages,
add_generation_prompt, tools=None, documents=None, bos_token and eos_token.
strftime_now reads a FIXED clock (FIXED_NOW) so that the goldens are stable;
the tests give runlm's interpreter the same clock.

Two sets are written:

  tests/data/chat_templates/   the built-in templates (src/chat_templates/
      NAME.jinja) over CASES:
        <name>.<case>.txt    the rendered text, byte for byte;
        <name>.<case>.error  when the template raises: the exception class on
                             the first line and its message on the second;
        cases.json           the conversations and token texts.

  tests/data/jinja_goldens/    the real templates in ../shared/templates
      (not copied here; the tests read them from there) over CONVERSATIONS,
      each with add_generation_prompt true and false:
        conversations.json   the conversations;
        <template>.json      {"bos_token", "eos_token", "results": {"<conv>.gen"
                             or "<conv>.nogen": {"text": ...} or {"error":
                             "<class>: <message>"}}}.

Only for regenerating test data, not a runtime dependency. Needs jinja2 >= 3.1
(Debian: apt-get install python3-jinja2). Run from anywhere:
  /usr/bin/python3 tools/render_chat_goldens.py
"""
import datetime
import glob
import json
import os

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BUILTIN_SRC = os.path.join(ROOT, "src", "chat_templates")
BUILTIN_OUT = os.path.join(ROOT, "tests", "data", "chat_templates")
SHARED_TEMPLATES = os.path.join(ROOT, "..", "shared", "templates")
SHARED_OUT = os.path.join(ROOT, "tests", "data", "jinja_goldens")

# strftime_now's clock: Friday 26 July 2024, 10:30:00 (tests/test_jinja_goldens.cpp).
FIXED_NOW = datetime.datetime(2024, 7, 26, 10, 30, 0)

# The special-token texts each built-in template's model passes to it.
TOKENS = {
    "llama2": {"bos": "<s>", "eos": "</s>"},
    "chatml": {"bos": "<s>", "eos": "<|im_end|>"},
    "zephyr": {"bos": "<s>", "eos": "</s>"},
    "mistral": {"bos": "<s>", "eos": "</s>"},
    "gemma": {"bos": "<bos>", "eos": "<eos>"},
}

LLAMA3 = ("<|begin_of_text|>", "<|eot_id|>")
DEEPSEEK = ("<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>")
QWEN = ("<|endoftext|>", "<|im_end|>")

# bos_token / eos_token of each shared template's model (its vocabulary's texts).
SHARED_TOKENS = {
    "CohereForAI-c4ai-command-r-plus-tool_use": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "GLM-4.6": ("[gMASK]", "<|endoftext|>"),
    "MiniMax-M2": ("]~!b[", "[e~["),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": ("<|begin_of_text|>", "<|im_end|>"),
    "Qwen-Qwen2.5-7B-Instruct": QWEN,
    "Qwen-Qwen3-0.6B": QWEN,
    "Qwen3-Coder": QWEN,
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": DEEPSEEK,
    "deepseek-ai-DeepSeek-V3.1": DEEPSEEK,
    "fireworks-ai-llama-3-firefunction-v2": LLAMA3,
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
    "ibm-granite-granite-3.3-2B-Instruct": ("<|end_of_text|>", "<|end_of_text|>"),
    "llama-cpp-deepseek-r1": DEEPSEEK,
    "meetkai-functionary-medium-v3.2": LLAMA3,
    "meta-llama-Llama-3.1-8B-Instruct": LLAMA3,
    "meta-llama-Llama-3.2-3B-Instruct": LLAMA3,
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "moonshotai-Kimi-K2": ("[BOS]", "[EOS]"),
    "openai-gpt-oss-120b": ("<|startoftext|>", "<|return|>"),
}

SYSTEM = {"role": "system", "content": "You are a helpful assistant"}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


# Built-in templates: name -> (messages, add_generation_prompt)
CASES = {
    "single": ([user("Hello")], True),
    "single_nogen": ([user("Hello")], False),
    "system": ([SYSTEM, user("Hello")], True),
    "multi": ([SYSTEM, user("Hello"), assistant("Hi there"), user("Who are you"),
               assistant("   I am an assistant   "), user("Another question")], True),
    "multi_nogen": ([user("Hello"), assistant("Hi there"), user("Who are you"),
                     assistant("   I am an assistant   ")], False),
    # Python's str.strip() removes Unicode whitespace (NBSP, ideographic and em
    # spaces, \x1c) as well as ASCII.
    "whitespace": ([user(" \t\n Tell me a joke \u00a0\u3000\n\x1c"), assistant("\u2003Why not? \r\n")], True),
    "unicode": ([user("Gr\u00fc\u00dfe, \u4e16\u754c \U0001f30d \u2014 ok?")], True),
    "empty_system": ([{"role": "system", "content": ""}, user("Hi")], True),
    "system_only": ([{"role": "system", "content": "Be brief."}], True),
    "system_mid": ([user("Hi"), {"role": "system", "content": "Be brief."}, user("Again")], True),
    "assistant_first": ([assistant("Hello!"), user("Hi")], True),
    "double_user": ([user("a"), user("b")], True),
    "empty": ([], True),
}

# Shared templates: name -> messages (each rendered with and without the
# generation prompt).
CONVERSATIONS = {
    "user": [user("Hello")],
    "system_user": [SYSTEM, user("What is 2+2?")],
    "multi_turn": [SYSTEM, user("Hello"), assistant("  Hi there!  "), user("Tell me a joke."),
                   assistant("\nWhy did the chicken cross the road?\n"), user("Why?")],
    "no_system_multi": [user("Hi"), assistant("Hello! How can I help?"), user("Thanks")],
    "unicode": [user("Gr\u00fc\u00dfe \u4e16\u754c \U0001f30d \u2014 \"quoted\" \\ back\tslash")],
    "empty_content": [user("")],
    "empty_system": [{"role": "system", "content": ""}, user("Hi")],
    "assistant_last": [user("Start"), assistant("  Reply with spaces  ")],
    "specials_in_text": [user("Say <|im_end|> and </s> and [INST] literally")],
}


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return FIXED_NOW.strftime(fmt)


def compile_template(source):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def render(template, messages, add_generation_prompt, bos, eos):
    return template.render(messages=messages, add_generation_prompt=add_generation_prompt, tools=None,
                           documents=None, bos_token=bos, eos_token=eos)


def read(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def write(path, text):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def builtin_goldens():
    for path in glob.glob(os.path.join(BUILTIN_OUT, "*.txt")) + glob.glob(os.path.join(BUILTIN_OUT, "*.error")):
        os.remove(path)
    for name, tok in TOKENS.items():
        template = compile_template(read(os.path.join(BUILTIN_SRC, name + ".jinja")))
        for case, (messages, add_generation_prompt) in CASES.items():
            try:
                text = render(template, messages, add_generation_prompt, tok["bos"], tok["eos"])
                out, body = name + "." + case + ".txt", text
            except jinja2.exceptions.TemplateError as e:
                out, body = name + "." + case + ".error", type(e).__name__ + "\n" + str(e) + "\n"
            write(os.path.join(BUILTIN_OUT, out), body)
    cases = {case: {"messages": m, "add_generation_prompt": g} for case, (m, g) in CASES.items()}
    write(os.path.join(BUILTIN_OUT, "cases.json"),
          json.dumps({"tokens": TOKENS, "cases": cases}, indent=1, ensure_ascii=True) + "\n")


def shared_goldens():
    os.makedirs(SHARED_OUT, exist_ok=True)
    names = sorted(os.path.basename(p)[:-len(".jinja")] for p in glob.glob(os.path.join(SHARED_TEMPLATES, "*.jinja")))
    missing = set(names) ^ set(SHARED_TOKENS)
    if missing:
        raise SystemExit("render_chat_goldens: no token texts for (or no template of) " + ", ".join(sorted(missing)))
    for name in names:
        bos, eos = SHARED_TOKENS[name]
        template = compile_template(read(os.path.join(SHARED_TEMPLATES, name + ".jinja")))
        results = {}
        for conv, messages in CONVERSATIONS.items():
            for gen in (True, False):
                key = conv + (".gen" if gen else ".nogen")
                try:
                    results[key] = {"text": render(template, messages, gen, bos, eos)}
                except jinja2.exceptions.TemplateError as e:
                    results[key] = {"error": type(e).__name__ + ": " + str(e)}
                except (TypeError, ValueError, LookupError) as e:
                    results[key] = {"error": type(e).__name__ + ": " + str(e)}
        write(os.path.join(SHARED_OUT, name + ".json"),
              json.dumps({"bos_token": bos, "eos_token": eos, "results": results}, indent=1, ensure_ascii=True) + "\n")
    write(os.path.join(SHARED_OUT, "conversations.json"),
          json.dumps({"now": FIXED_NOW.isoformat(), "conversations": CONVERSATIONS}, indent=1, ensure_ascii=True) + "\n")


def main():
    builtin_goldens()
    shared_goldens()


if __name__ == "__main__":
    main()
