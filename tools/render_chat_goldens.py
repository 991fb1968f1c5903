#!/usr/bin/env python3
"""Renders the chat-template goldens in tests/data/chat_templates/.

Each <name>.jinja there is a model family's official chat template, exactly as
its tokenizer_config.json "chat_template" string decodes. This script renders
every template over the conversations in CASES the way transformers'
apply_chat_template does (jinja2's ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension, a raise_exception
global that raises TemplateError, and bos_token/eos_token variables), and
writes:

  <name>.<case>.txt    the rendered text, byte for byte;
  <name>.<case>.error  when the template raises: the exception class on the
                       first line and its message on the second;
  cases.json           the conversations and token texts, which the C++ test
                       (tests/test_chat_template.cpp) replays.

Only for regenerating test data, not a runtime dependency. Needs jinja2 >= 3
(Debian: apt-get install python3-jinja2). Run from anywhere:
  python3 tools/render_chat_goldens.py
"""
import glob
import json
import os

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "chat_templates")

# The special-token texts each model's tokenizer passes to its template.
TOKENS = {
    "llama2": {"bos": "<s>", "eos": "</s>"},
    "chatml": {"bos": "<s>", "eos": "<|im_end|>"},
    "zephyr": {"bos": "<s>", "eos": "</s>"},
    "mistral": {"bos": "<s>", "eos": "</s>"},
    "gemma": {"bos": "<bos>", "eos": "<eos>"},
}

SYSTEM = {"role": "system", "content": "You are a helpful assistant"}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


# name -> (messages, add_generation_prompt)
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


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def compile_template(source):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def main():
    for path in glob.glob(os.path.join(DATA, "*.txt")) + glob.glob(os.path.join(DATA, "*.error")):
        os.remove(path)
    for name, tok in TOKENS.items():
        with open(os.path.join(DATA, name + ".jinja"), encoding="utf-8", newline="") as f:
            template = compile_template(f.read())
        for case, (messages, add_generation_prompt) in CASES.items():
            try:
                text = template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                       bos_token=tok["bos"], eos_token=tok["eos"])
                out, body = name + "." + case + ".txt", text
            except jinja2.exceptions.TemplateError as e:
                out, body = name + "." + case + ".error", type(e).__name__ + "\n" + str(e) + "\n"
            with open(os.path.join(DATA, out), "w", encoding="utf-8", newline="") as f:
                f.write(body)
    cases = {case: {"messages": m, "add_generation_prompt": g} for case, (m, g) in CASES.items()}
    with open(os.path.join(DATA, "cases.json"), "w", encoding="utf-8", newline="") as f:
        json.dump({"tokens": TOKENS, "cases": cases}, f, indent=1, ensure_ascii=True)
        f.write("\n")


if __name__ == "__main__":
    main()
