// The Jinja interpreter on its own: expressions, filters, tests, methods,
// whitespace control, scoping, errors with line and column, and the limits
// that keep a hostile template from crashing, hanging or eating memory. The
// expected texts of RendersLikeJinja2 were rendered by Python's jinja2 3.1
// in transformers' environment (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, loopcontrols, its tojson).
#include <gtest/gtest.h>

#include <chrono>

#include "common.h"
#include "jinja_template.h"
#include "test_support.h"

using namespace runlm;
using namespace runlm::jinja;
using runlm::test::error_of;

namespace {

std::string render(const std::string& src, const std::vector<std::pair<std::string, Value>>& vars = {},
                   const RenderOptions& o = RenderOptions{}) {
  return Template(src).render(vars, o).text;
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int k = 0; k < n; ++k) out += s;
  return out;
}

struct Case {
  const char* name;
  const char* source;
  const char* expected;
};

const Case kCases[] = {
    {"literals", "{{ 1 }}|{{ 1.0 }}|{{ 1.5e3 }}|{{ 1e20 }}|{{ 0.1 + 0.2 }}|{{ none }}|{{ true }}|{{ 'a' 'b' }}|{{ [1, 'x', none] }}|{{ {'k': [1.5, false]} }}|{{ (1,) }}|{{ () }}", "1|1.0|1500.0|1e+20|0.30000000000000004|None|True|ab|[1, 'x', None]|{'k': [1.5, False]}|(1,)|()"},
    {"arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 'ab' * 3 }} {{ [0] * 2 }} {{ 1 + 2 * 3 - 4 }} {{ 10 - 2 - 3 }} {{ 'a' ~ 1 ~ none }} {{ -(3) }} {{ 3 - -3 }}", "3 -4 2 3.5 1024 0.5 ababab [0, 0] 3 5 a1None -3 6"},
    {"compare", "{{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'x' in 'xyz' }} {{ 2 not in [1, 3] }} {{ 'k' in {'k': 1} }} {{ not 0 }} {{ 0 or 'd' }} {{ 1 and 2 }} {{ [1, 2] == [1, 2] }}", "True True True False True True True True d 2 True"},
    {"ternary", "{{ 'y' if 1 else 'n' }}{{ 'y' if 0 else 'n' }}[{{ 'y' if 0 }}]{{ 'a' if false else 'b' if true else 'c' }}", "yn[]b"},
    {"escapes", "{{ 'a\\nb\\t\\'\\\"\\\\ \\u00e9 \\x41 \\101' }}|{{ \"it's\" }}", "a\nb\t'\"\\ \xc3""\xa9"" A A|it's"},
    {"strings", "{{ '  x y  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'a  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(none, 1) }}|{{ 'a-b-c'.rsplit('-', 1) }}|{{ 'hello'.startswith('he') }}|{{ 'hello'.endswith(('x', 'lo')) }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'hello world'.title() }}|{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}|{{ 'abc'.find('c') }}|{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ 'x{}y{}'.format(1, 'z') }}", "x y|hi|a|a|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a-b', 'c']|True|True|bba|Hello World|HIhi|2|['a', 'b', 'c']|x1yz"},
    {"slices", "{{ 'abcdef'[1:3] }}|{{ 'abcdef'[::-1] }}|{{ 'abcdef'[::2] }}|{{ [1,2,3,4][-2:] }}|{{ [1,2,3,4][:-1] }}|{{ [1,2,3,4][3:0:-1] }}|{{ 'h\xc3""\xa9""llo'[1] }}|{{ 'h\xc3""\xa9""llo'|length }}|{{ [1,2,3][5] }}|{{ 'abc'[-1] }}", "bc|fedcba|ace|[3, 4]|[1, 2, 3]|[4, 3, 2]|\xc3""\xa9""|5||c"},
    {"filters1", "{{ '  x  '|trim }}|{{ 'xax'|trim('x') }}|{{ [1,2,3]|length }}|{{ [1,2,3]|join('-') }}|{{ 'ab'|upper }}|{{ 'AB'|lower }}|{{ x|default('d') }}|{{ ''|default('d', true) }}|{{ [3,1,2]|first }}|{{ [3,1,2]|last }}|{{ 'abc'|list }}|{{ {'a': 1, 'b': 2}|items|list }}|{{ 'a b'|replace(' ', '_') }}|{{ 5|string }}|{{ '42'|int + 1 }}|{{ '4.7'|int }}|{{ 'x'|int }}|{{ 'hello there'|capitalize }}|{{ 'hello-there you'|title }}", "x|a|3|1-2-3|AB|ab|d|d|3|2|['a', 'b', 'c']|[('a', 1), ('b', 2)]|a_b|5|43|4|0|Hello there|Hello-There You"},
    {"filters2", "{{ [{'a': 1, 'n': 'x'}, {'a': 0, 'n': 'y'}, {'n': 'z'}]|selectattr('a')|map(attribute='n')|list }}|{{ [{'a': 1, 'n': 'x'}, {'a': 0, 'n': 'y'}]|rejectattr('a')|map(attribute='n')|join }}|{{ [{'r': 'u'}, {'r': 's'}]|selectattr('r', 'equalto', 's')|list|length }}|{{ {'b': 1, 'A': 2}|dictsort }}|{{ ['b', 'A', 'a']|sort }}|{{ ['B', 'a', 'b', 'A']|unique|list }}|{{ [1, 5, 3]|max }}|{{ [1, 5, 3]|min }}|{{ [1, 2]|sum }}|{{ ['a', 'b']|map('upper')|list }}|{{ [1, 2, 3]|reverse|list }}|{{ 2.5|round }}|{{ 3.14159|round(2) }}|{{ -3|abs }}|{{ [0, 1, '', 'x']|select|list }}|{{ '%s=%d'|format('a', 3) }}|{{ '<a&b>'|e }}", "['x']|y|1|[('A', 2), ('b', 1)]|['A', 'a', 'b']|['B', 'a']|5|1|3|['A', 'B']|[3, 2, 1]|2.0|3.14|3|[1, 'x']|a=3|&lt;a&amp;b&gt;"},
    {"indent", "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent('> ', blank=true) }}", "a\n  b\n\n  c|  a\n  b|a\n> \n> b"},
    {"tojson", "{{ {'b': [1, 2.0, none, true], 'a': '\xc3""\xa9""\"\\n'}|tojson }}|{{ {'b': 1, 'a': {'c': []}}|tojson(indent=2) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ [1, 2]|tojson(separators=(',', ':')) }}|{{ '\xc3""\xa9""'|tojson(true) }}|{{ {}|tojson(indent=2) }}", "{\"b\": [1, 2.0, null, true], \"a\": \"\xc3""\xa9""\\\"\\n\"}|{\n  \"b\": 1,\n  \"a\": {\n    \"c\": []\n  }\n}|{\"a\": 2, \"b\": 1}|[1,2]|\"\\u00e9\"|{}"},
    {"tests", "{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ [] is sequence }}{{ 1 is number }}{{ 1.5 is float }}{{ 1 is integer }}{{ true is boolean }}{{ true is true }}{{ 0 is false }}{{ 4 is divisibleby 2 }}{{ 3 is odd }}{{ 'a' is equalto 'a' }}{{ 'a' is eq('b') }}{{ 2 is gt 1 }}{{ 2 is in [1, 2] }}{{ 'ab' is lower }}{{ 'x' is not none }}{{ x is not defined }}", "FalseTrueTrueTrueTrueFalseTrueTrueFalseTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueFalseTrueTrueTrueTrueTrue"},
    {"loop", "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('o', 'e') }};{% endfor %}", "1032TrueFalse3bo;2121FalseFalse3ace;3210FalseTrue3bo;"},
    {"loopctl", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}|{% for i in [] %}x{% else %}empty{% endfor %}|{% for i in range(6) if i is even %}{{ i }}{{ loop.length }}{% endfor %}|{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}|{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}|{{ range(2, 10, 3)|list }}", "0134|empty|032343|a=1,b=2,|37|[2, 5, 8]"},
    {"scope", "{% set x = 1 %}{% for i in range(2) %}{% set x = x + 10 %}{{ x }},{% endfor %}{{ x }}|{% if true %}{% set y = 5 %}{% endif %}{{ y }}|{% set ns = namespace(n=0, s='') %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }}{{ ns.s }}|{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set blk %}in {{ x }} block{% endset %}[{{ blk }}]|{% with z = 3 %}{{ z }}{% endwith %}{{ z }}", "11,11,1|5|3012|12|[in 1 block]|3"},
    {"macros", "{% macro m(a, b='B', c=none) %}<{{ a }}{{ b }}{{ c }}>{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}{{ m() }}|{% macro rec(n) %}{{ n }}{% if n > 0 %}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}|{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}inner{% endcall %}|{% filter upper %}up {{ 'x' }}{% endfilter %}", "<1BNone><12None><1B3><BNone>|3210|[inner]|UP X"},
    {"dicts", "{% set d = {'a': 1, 'b': {'c': 2}} %}{{ d.a }}{{ d['b']['c'] }}{{ d.b.c }}{{ d.get('a') }}{{ d.get('z', 'dz') }}{{ d.get('z') }}{{ d.keys()|list }}{{ d.values()|list|length }}{{ d.missing }}{{ d.items()|list }}{{ d|length }}{{ 'a' in d }}{{ d.z is defined }}", "1221dzNone['a', 'b']2[('a', 1), ('b', {'c': 2})]2TrueFalse"},
    {"whitespace", "a\n  {% if true %}\n    b\n  {% endif %}\nc {{- ' d ' -}} e\n{%- if true %} f {% endif -%}\n g\n{# comment #}\nh {#- c -#} i\n  {%+ if true %}j{% endif %}\n{% raw %}{{ k }}{% endraw %}\n", "a\n    b\nc d e f g\nhi\n  j{{ k }}"},
    {"trailing", "x\n", "x"},
    {"crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc", "a\nb\nc"},
    {"undefined_ops", "[{{ u }}]{{ u|length }}{{ u|list }}{{ u is none }}{{ u == u }}{{ u|string }}{{ u ~ 'x' }}{% for x in u %}no{% endfor %}{{ u|default(5) }}{{ not u }}", "[]0[]FalseTruex5True"},
    {"str_of", "{{ [1.0, 'a\\'b', \"q\\\"\", '\\n'] }}|{{ {'k': none, 1: true} }}|{{ 10 ** 20 if false else 12345678901234 }}|{{ 1e-5 }}|{{ 123456789.0 * 1000 }}|{{ 1e16 }}|{{ 2.5e-4 }}|{{ 1/3 }}", "[1.0, \"a'b\", 'q\"', '\\n']|{'k': None, 1: True}|12345678901234|1e-05|123456789000.0|1e+16|0.00025|0.3333333333333333"},
};

// Rendered with messages = [system "Be nice to everyone", user "Hi there
// friend", assistant " ok "], add_generation_prompt, bos "<s>", eos "</s>".
const std::pair<const char*, const char*> kConversationCases[] = {
    {"{%- for m in messages -%}\n  {{- m.role }}: {{ m.content -}}\n{% endfor -%}", "system: Be nice to everyoneuser: Hi there friendassistant:  ok "},
    {"  {#- c -#}  \n  {# c2 #}\nx\n    {%- if true %}\ty{% endif %}  \n{% if true -%}\n  z\n{%- endif %}", "x\ty  \nz"},
    {"{% raw -%}  {{ a }}  {%- endraw %}|{%- raw %} b {% endraw -%} |", "{{ a }}| b |"},
    {"{% macro outer(x) %}({{ caller(x ~ '!') }}){% endmacro %}{% call(v) outer('a') %}[{{ v }}]{% endcall %}", "([a!])"},
    {"{{ {'b': 1, 'a': {'z': [1, {'y': none}], 'c': '\xc3""\xa9""'}}|tojson(indent=4) }}", "{\n    \"b\": 1,\n    \"a\": {\n        \"z\": [\n            1,\n            {\n                \"y\": null\n            }\n        ],\n        \"c\": \"\xc3""\xa9""\"\n    }\n}"},
    {"{{ '\xc3""\x89""COLE \xc3""\xa9""cole \xc3""\x9f""'|lower }}|{{ 'stra\xc3""\x9f""e'|upper }}|{{ '\xc3""\xa9""lan vital'|title }}|{{ '\xc3""\xa9""bc'|capitalize }}", "\xc3""\xa9""cole \xc3""\xa9""cole \xc3""\x9f""|STRASSE|\xc3""\x89""lan Vital|\xc3""\x89""bc"},
    {"{{ 1e100 }} {{ -0.0 }} {{ 1.5e-7 }} {{ 100.0 }} {{ 1e15 }} {{ 123456789012345678.0 }} {{ 0.000123 }} {{ 2**62 }}", "1e+100 -0.0 1.5e-07 100.0 1000000000000000.0 1.2345678901234568e+17 0.000123 4611686018427387904"},
    {"{{ 2.675|round(2) }} {{ 0.5|round }} {{ 1.5|round }} {{ -2.5|round }} {{ 2.7|round(0, 'floor') }} {{ 2.1|round(method='ceil') }} {{ 7|round }}", "2.67 0.0 2.0 -2.0 2.0 3.0 7"},
    {"{{ 3.9|int }} {{ -3.9|int }} {{ '  12  '|int }} {{ '0x1A'|int(0, 16) }} {{ '1e3'|int }} {{ true|int }} {{ '3.5'|float }} {{ 'a'|float }}", "3 -3 12 26 1000 1 3.5 0.0"},
    {"{{ [{'n': 'b', 'v': 2}, {'n': 'a', 'v': 1}]|sort(attribute='n')|map(attribute='v')|list }} {{ [3, 1, 2]|sort(reverse=true) }}", "[1, 2] [3, 2, 1]"},
    {"{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}{{ m.role[0] }}{% else %}none{% endfor %}", "1/2u2/2a"},
    {"{{ messages[0].content.split(' ')|join(',') }}|{{ messages|map(attribute='role')|join(' ') }}|{{ messages|selectattr('role', 'in', ['user'])|list|length }}", "Be,nice,to,everyone|system user assistant|1"},
    {"{% set x = messages[-1] %}{{ x.role }}{{ x['content']|length }}{{ messages[1:]|length }}{{ (messages|last).role }}", "assistant42assistant"},
    {"{{ 'a' if messages|length > 1 else 'b' }}{{ messages[0]['role'] == 'system' and 'sys' or 'nosys' }}", "asys"},
    {"{%- set ns = namespace(found=false) -%}{%- for m in messages -%}{%- if m.role == 'user' and not ns.found -%}{%- set ns.found = true -%}first user: {{ m.content }}{%- endif -%}{%- endfor -%}", "first user: Hi there friend"},
    {"{{ '%5.2f|%-4d|%x'|format(3.14159, 7, 255) }}", " 3.14|7   |ff"},
    {"{{ 'a,b'.split(',', maxsplit=1) }} {{ 'x'.join(['1', '2']) }} {{ 'Hello'.replace('l', 'L') }} {{ 'abc'.upper().lower() }} {{ 'a b'.title() }} {{ '  '.isspace() }} {{ '12'.isdigit() }}", "['a', 'b'] 1x2 HeLLo abc A B True True"},
    {"{{ {'a': 1}.items()|list }} {{ {'a': 1}|list }} {{ {'a': 1}.keys()|first }} {{ dict(a=1, b=2) }} {{ dict(a=1)['a'] }}", "[('a', 1)] ['a'] a {'a': 1, 'b': 2} 1"},
    {"{{ [1, 2, 3]|select('odd')|list }} {{ [1, 2, 3]|reject('equalto', 2)|list }} {{ ['a', 'B']|map('upper')|list }} {{ [[1], [2, 3]]|map('length')|list }}", "[1, 3] [1, 3] ['A', 'B'] [1, 2]"},
    {"{{ 'abc'|center(9) }}|{{ 'ab'|center(9) }}|{{ 'a b  c'|wordcount }}|{{ [1, 2]|sum(start=10) }}|{{ 'x'|attr('upper') is callable }}", "   abc   |    ab   |3|13|True"},
    {"{{ none|string }}{{ none|default('d') }}{{ none is none }}{{ none|tojson }}{{ true|tojson }}{{ 1.0|tojson }}{{ 'x'|tojson }}", "NoneNoneTruenulltrue1.0\"x\""},
    {"{{ messages[0].content[::-1] }}|{{ messages[0].content[2:100] }}|{{ messages[0].content[-3:] }}", "enoyreve ot ecin eB| nice to everyone|one"},
    {"{% set a = [1, 2] + [3] %}{{ a }}{% set b = (1, 2) + (3,) %}{{ b }}{{ a|length }}{{ a[1:] }}{{ 'x' ~ a }}", "[1, 2, 3](1, 2, 3)3[2, 3]x[1, 2, 3]"},
    {"{% if messages %}has{% endif %}{% if not [] %}empty{% endif %}{% if {} %}no{% elif 0.0 %}no{% else %}else{% endif %}", "hasemptyelse"},
    {"{{ 10 % 3 }} {{ -10 % 3 }} {{ 10 % -3 }} {{ 7.5 % 2 }} {{ -7.5 // 2 }} {{ 2 ** 0.5 }} {{ 10 / 4 }} {{ 9 // 2.0 }}", "1 2 -2 1.5 -4.0 1.4142135623730951 2.5 4.0"},
    {"{{ 'The \"q\" and \\'s\\'' }} {{ \"tab\\there\" }} {{ 'uni \\u4e16 \\U0001F30D' }}", "The \"q\" and 's' tab\there uni \xe4""\xb8""\x96"" \xf0""\x9f""\x8c""\x8d"""},
    {"{% set t %}\n  a\n  {% if true %}\n  b\n  {% endif %}\n{% endset %}[{{ t }}]", "[  a\n  b\n]"},
    {"{{ messages|tojson }}", "[{\"role\": \"system\", \"content\": \"Be nice to everyone\"}, {\"role\": \"user\", \"content\": \"Hi there friend\"}, {\"role\": \"assistant\", \"content\": \" ok \"}]"},
    {"{{ messages[0] }}", "{'role': 'system', 'content': 'Be nice to everyone'}"},
    {"{% for k, v in messages[0]|dictsort %}{{ k }}={{ v }};{% endfor %}{% for k in messages[0] %}{{ k }}{% endfor %}", "content=Be nice to everyone;role=system;rolecontent"},
    {"{%- if messages[0].role == 'system' -%}\n    {%- set sys = messages[0].content -%}\n    {%- set messages = messages[1:] -%}\n{%- endif -%}\n{{ sys }}|{{ messages|length }}", "Be nice to everyone|2"},
    {"{{ '{{' }} {{ '}}' }} {{ '{%' }} {{ '%}' }} {{ '{#' }}", "{{ }} {% %} {#"},
    {"{{ [1,2,3]|first }}{{ []|first }}{{ 'abc'|last }}{{ [1,[2,3]]|last|last }}{{ range(5)|list|last }}", "1c34"},
    {"{{ 'a' < 'b' < 'c' }}{{ 1 == 1 == 1 }}{{ 1 != 2 != 1 }}{{ (1, 2) < (1, 3) }}{{ [1] < [1, 0] }}", "TrueTrueTrueTrueTrue"},
    {"{{ 'abc' is string and 'abc' is not number }}{{ 3 is divisibleby(3) }}{{ 'x' is in 'xyz' }}{{ 'X' is upper }}{{ [] is sequence }}{{ {} is iterable }}", "TrueTrueTrueTrueTrueTrue"},
};

}  // namespace

TEST(Jinja, RendersLikeJinja2) {
  for (const Case& c : kCases) {
    std::string got;
    try {
      got = render(c.source);
    } catch (const Error& e) {
      ADD_FAILURE() << c.name << ": " << e.what();
      continue;
    }
    EXPECT_EQ(got, c.expected) << c.name;
  }
}

TEST(Jinja, RendersConversationsLikeJinja2) {
  auto msg = [](const char* role, const char* content) {
    return Value::make_dict({{Value::string("role"), Value::string(role)}, {Value::string("content"), Value::string(content)}});
  };
  const std::vector<std::pair<std::string, Value>> vars = {
      {"messages", Value::make_list({msg("system", "Be nice to everyone"), msg("user", "Hi there friend"),
                                     msg("assistant", " ok ")})},
      {"add_generation_prompt", Value::boolean(true)},
      {"bos_token", Value::string("<s>")},
      {"eos_token", Value::string("</s>")},
  };
  for (const auto& [source, expected] : kConversationCases) {
    std::string got;
    try {
      got = render(source, vars);
    } catch (const Error& e) {
      ADD_FAILURE() << source << ": " << e.what();
      continue;
    }
    EXPECT_EQ(got, expected) << source;
  }
}

TEST(Jinja, VariablesAndMessages) {
  const Value msgs = Value::make_list({Value::make_dict({{Value::string("role"), Value::string("user")},
                                                        {Value::string("content"), Value::string("hi")}})});
  EXPECT_EQ(render("{% for m in messages %}{{ m.role }}:{{ m['content'] }}{% endfor %}{{ bos }}",
                   {{"messages", msgs}, {"bos", Value::string("<s>")}}),
            "user:hi<s>");
  // tools=None is defined but none.
  EXPECT_EQ(render("{{ tools is defined }}{{ tools is none }}{{ x is defined }}", {{"tools", Value::none()}}),
            "TrueTrueFalse");
}

TEST(Jinja, ErrorsNameLineAndColumn) {
  struct E {
    const char* source;
    const char* where;
    const char* what;
  };
  const E kErrors[] = {
      {"ab\n  {{ raise_exception('boom ' ~ 1) }}", "line 2, column 6", "boom 1"},
      {"{{ u.x }}", "line 1", "'u' is undefined"},
      {"x\n{{ u() }}", "line 2", "'u' is undefined"},
      {"{% if x %}\n{{ 1 + }}", "line 2, column 8", "unexpected"},
      {"{% for x in y %}", "line 1", "endfor"},
      {"{{ x|nosuch }}", "line 1, column 6", "No filter named 'nosuch'"},
      {"{{ x is nosuch }}", "line 1", "No test named 'nosuch'"},
      {"{% include 'x' %}", "line 1", "unsupported statement 'include'"},
      {"{% set l = [] %}{% set _ = l.append(1) %}", "line 1", "access to attribute 'append' of 'list' object is unsafe"},
      {"{{ 1 + 'a' }}", "line 1", "unsupported operand type(s) for +: 'int' and 'str'"},
      {"{{ 1 / 0 }}", "line 1", "division by zero"},
      {"{% for x in none %}{% endfor %}", "line 1", "'NoneType' object is not iterable"},
      {"{{ range(100001)|length }}", "line 1", "Range too big"},
      {"{{ 1 < 'a' }}", "line 1", "'<' not supported between instances of 'int' and 'str'"},
      {"{% break %}", "line 1", "outside a for loop"},
      {"{{ 'abc", "line 1", "not closed"},
      {"{{ 99999999999999999999 }}", "line 1", "too large"},
      {"{{ 9223372036854775807 + 1 }}", "line 1", "integer overflow"},
  };
  for (const E& e : kErrors) {
    const std::string msg = error_of([&] { render(e.source); });
    EXPECT_NE(msg.find(e.where), std::string::npos) << e.source << " -> " << msg;
    EXPECT_NE(msg.find(e.what), std::string::npos) << e.source << " -> " << msg;
  }
  // An unknown filter in an if branch fails only when it runs, as in jinja2.
  EXPECT_EQ(render("{% if false %}{{ x|nosuch }}{% endif %}ok"), "ok");
  EXPECT_NE(error_of([] { render("{% if true %}{{ x|nosuch }}{% endif %}"); }).find("No filter named"),
            std::string::npos);
}

TEST(Jinja, StrftimeNowReadsTheInjectedClock) {
  RenderOptions o;
  o.now = [] {
    std::tm t{};
    t.tm_year = 124;
    t.tm_mon = 6;
    t.tm_mday = 26;
    t.tm_wday = 5;
    return t;
  };
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y, %A') }}", {}, o), "26 Jul 2024, Friday");
  // Without one, the real clock: today's year.
  const std::string year = render("{{ strftime_now('%Y') }}");
  EXPECT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}

TEST(Jinja, LiteralSpansFollowTheText) {
  const Value content = Value::literal_string("  <|x|>  ");
  const Rendered r = Template("[{{ c }}]{{ '<' + c|trim + '>' }}{{ c.strip() ~ c.upper() }}")
                         .render({{"c", content}}, RenderOptions{});
  EXPECT_EQ(r.text, "[  <|x|>  ]<<|x|>><|x|>  <|X|>  ");
  ASSERT_EQ(r.literal_spans.size(), 3u);
  EXPECT_EQ(r.text.substr(r.literal_spans[0].first, r.literal_spans[0].second - r.literal_spans[0].first), "  <|x|>  ");
  EXPECT_EQ(r.text.substr(r.literal_spans[1].first, r.literal_spans[1].second - r.literal_spans[1].first), "<|x|>");
  EXPECT_EQ(r.text.substr(r.literal_spans[2].first, r.literal_spans[2].second - r.literal_spans[2].first), "<|x|>");
}

TEST(Jinja, LimitsStopHostileTemplates) {
  RenderOptions o;
  o.limits.max_steps = 2'000'000;
  struct L {
    std::string source;
    const char* what;
  };
  const L kHostile[] = {
      // Huge loops: nested ranges are each within the sandbox's range limit.
      {"{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "too much work"},
      // Unbounded macro recursion.
      {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "too deeply"},
      // Output doubling.
      {"{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
       "larger than the limit"},
      {"{{ 'x' * 100000000000 }}", "larger than the limit"},
      // Lists nested without end (str() and == recurse on them).
      {"{% set h = namespace(x=[]) %}{% for i in range(100000) %}{% set h.x = [h.x] %}{% endfor %}{{ h.x }}",
       "nest too deeply"},
      {"{% set h = namespace(x={}) %}{% for i in range(100000) %}{% set h.x = dict(a=h.x) %}{% endfor %}", "nest too deeply"},
      // Quadratic copying: bounded by work and by what may be built.
      {"{% set h = namespace(l=[]) %}{% for i in range(100000) %}{% set h.l = h.l + [i] %}{% endfor %}", "more than"},
      {"{{ [1] * 100000000000 }}", "list of more than"},
      // Deep nesting in the source.
      {"{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}", "too deeply"},
      {"{{ " + std::string(3000, '[') + std::string(3000, ']') + " }}", "too deeply"},
      {"{{ " + std::string(3000, '-') + "1 }}", "too deeply"},
      {"{{ " + repeat("not ", 3000) + "1 }}", "too deeply"},
      {[] {
         std::string s;
         for (int k = 0; k < 1000; ++k) s += "{% if true %}";
         return s;
       }(),
       "too deeply"},
  };
  for (const L& l : kHostile) {
    const std::string msg = error_of([&] { render(l.source, {}, o); });
    EXPECT_NE(msg.find(l.what), std::string::npos) << l.source.substr(0, 80) << " -> " << msg;
  }
  // A namespace holding itself is fine (and freed: the ASan build checks),
  // and so is a long chain of them (not destroyed recursively).
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns.self.self is defined }}"), "True");
  EXPECT_EQ(render("{% set h = namespace(n=none) %}{% for i in range(100000) %}{% set h.n = namespace(p=h.n) %}"
                   "{% endfor %}{{ h.n.p.p is defined }}"),
            "True");
  // What a template may build over a render is bounded.
  RenderOptions small;
  small.limits.max_alloc_bytes = 1 << 20;
  EXPECT_NE(error_of([&] { render("{% for i in range(100) %}{{ 'x' * 100000 }}{% endfor %}", {}, small); })
                .find("more than 1 MiB"),
            std::string::npos);
}
