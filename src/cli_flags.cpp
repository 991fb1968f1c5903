#include "cli_flags.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <map>
#include <sstream>

#include "common.h"

namespace runlm {

namespace {

std::vector<std::string> split_words(const char* s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// "-1", "-0.5", "-1e3": values, never flags (e.g. -s -1, --temp -0.5).
bool is_number(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end != s.c_str() && *end == '\0';
}

struct Known {
  std::map<std::string, bool> longs;   // name -> takes a value
  std::map<std::string, bool> shorts;  // letter -> takes a value
};

Known index_options(const std::vector<CliOptionInfo>& options) {
  Known k;
  for (const auto& o : options) {
    if (!o.short_name.empty()) k.shorts[o.short_name] = o.takes_value;
    for (const auto& l : o.long_names) k.longs[l] = o.takes_value;
  }
  return k;
}

const LlamaFlagAlias* find_alias(const std::string& spelling) {
  for (const auto& a : llama_flag_aliases())
    for (const auto& s : split_words(a.spellings))
      if (s == spelling) return &a;
  return nullptr;
}

// The known spelling closest to `flag`, for "did you mean".
std::string closest(const std::string& flag, const Known& known) {
  std::vector<std::string> candidates;
  for (const auto& [l, v] : known.longs) candidates.push_back("--" + l);
  for (const auto& [s, v] : known.shorts) candidates.push_back("-" + s);
  for (const auto& a : llama_flag_aliases())
    if (known.longs.count(a.target))
      for (const auto& s : split_words(a.spellings)) candidates.push_back(s);
  std::string best;
  int best_d = INT_MAX;
  for (const auto& c : candidates) {
    const int d = edit_distance(flag, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

[[noreturn]] void unknown_option(const std::string& flag, const Known& known, const std::string& program) {
  const std::string near = closest(flag, known);
  if (near.empty()) fail("unknown option %s (see '%s --help')", flag.c_str(), program.c_str());
  fail("unknown option %s; the closest %s knows is %s (see '%s --help')", flag.c_str(), program.c_str(),
       near.c_str(), program.c_str());
}

}  // namespace

const std::vector<LlamaFlagAlias>& llama_flag_aliases() {
  static const std::vector<LlamaFlagAlias> kAliases = {
      {"-ngl --n-gpu-layers --gpu-layers", "n-gpu-layers", "", "this subcommand does not place layers"},
      {"-fa --flash-attn", "flash-attn", "on=on auto=auto off=off",
       "-fa belongs to the subcommands that run a model (generate, chat, batch, bench, perplexity)"},
      {"-dev", "device", "", "this subcommand does not choose a device"},
      {"-cnv --conversation", "conversation", "", "conversation mode is its own subcommand: use 'runlm chat'"},
      {"-no-cnv --no-conversation", "no-conversation", "",
       "'runlm chat' is always a conversation; for a plain completion use 'runlm generate'"},
      {"-sys --system-prompt", "system-prompt", "", "a system prompt belongs to 'runlm chat'"},
      {"-np", "parallel", "", "parallel sequences (-np) are for 'runlm batch'"},
      {"-npl", "npl", "", "-npl is llama-batched-bench's mode: use 'runlm bench -npl'"},
      {"-npp", "npp", "", "-npp belongs to 'runlm bench -npl'"},
      {"-ntg", "ntg", "", "-ntg belongs to 'runlm bench -npl'"},
      {"-ctk", "cache-type-k", "", "this subcommand has no KV cache"},
      {"-ctv", "cache-type-v", "", "this subcommand has no KV cache"},
      // runlm's -b is what llama.cpp calls the physical batch (-ub): the
      // tokens one forward pass evaluates.
      {"-ub --ubatch-size", "batch-size", "", "this subcommand has no batch size"},
      {"--kl-divergence-base", "kl-base", "", "KL divergence is 'runlm perplexity --kl-base'"},
  };
  return kAliases;
}

int edit_distance(const std::string& a, const std::string& b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

CliRewrite rewrite_cli_args(const std::vector<std::string>& args, const std::vector<CliOptionInfo>& options,
                            const std::string& program, bool allow_positional) {
  const Known known = index_options(options);
  CliRewrite out;
  auto positional = [&](const std::string& a) {
    if (allow_positional) {
      out.args.push_back(a);
      return;
    }
    if (known.longs.count("prompt"))
      fail("unexpected argument '%s': the prompt goes after -p (or in a file with -f)", a.c_str());
    fail("unexpected argument '%s' (see '%s --help')", a.c_str(), program.c_str());
  };
  // Copies the value of an option that takes one (the next argument, even
  // when it starts with a dash: -p "-ngl", --temp -0.5).
  auto take_value = [&](size_t& i, const std::string& flag) {
    if (i + 1 >= args.size()) fail("%s needs a value (see '%s --help')", flag.c_str(), program.c_str());
    out.args.push_back(args[++i]);
  };

  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      for (++i; i < args.size(); ++i) positional(args[i]);
      break;
    }
    if (a.size() < 2 || a[0] != '-' || is_number(a)) {
      positional(a);
      continue;
    }
    // The flag itself and an attached "=value".
    const size_t eq = a.rfind("--", 0) == 0 ? a.find('=') : std::string::npos;
    const std::string flag = a.substr(0, eq);
    const bool has_inline = eq != std::string::npos;
    const std::string inline_value = has_inline ? a.substr(eq + 1) : "";

    // Left alone: its meaning belongs to the chat-template engine.
    if (flag == "--jinja") {
      out.args.push_back(a);
      continue;
    }
    if (const LlamaFlagAlias* alias = find_alias(flag)) {
      const auto target = known.longs.find(alias->target);
      if (target == known.longs.end())
        fail("%s is not supported by %s: %s", flag.c_str(), program.c_str(), alias->missing_note);
      out.args.push_back(std::string("--") + alias->target);
      if (!target->second) {
        RUNLM_CHECK(!has_inline, "%s takes no value", flag.c_str());
        continue;
      }
      std::string value;
      if (has_inline) {
        value = inline_value;
      } else {
        RUNLM_CHECK(i + 1 < args.size(), "%s needs a value (see '%s --help')", flag.c_str(), program.c_str());
        value = args[++i];
      }
      const std::string map = alias->value_map;
      if (!map.empty()) {
        std::string mapped, choices;
        for (const auto& pair : split_words(alias->value_map)) {
          const size_t k = pair.find('=');
          choices += (choices.empty() ? "" : ", ") + pair.substr(0, k);
          if (pair.substr(0, k) == value) mapped = pair.substr(k + 1);
        }
        RUNLM_CHECK(!mapped.empty(), "%s takes %s, got '%s'", flag.c_str(), choices.c_str(), value.c_str());
        value = mapped;
      }
      out.args.push_back(value);
      continue;
    }
    if (flag.rfind("--", 0) == 0) {
      const auto it = known.longs.find(flag.substr(2));
      if (it == known.longs.end()) unknown_option(flag, known, program);
      out.args.push_back(a);
      if (it->second && !has_inline) take_value(i, flag);
      continue;
    }
    // One dash: exactly one letter. "-fa" is never "-f a".
    if (flag.size() != 2) unknown_option(flag, known, program);
    const auto it = known.shorts.find(flag.substr(1));
    if (it == known.shorts.end()) unknown_option(flag, known, program);
    out.args.push_back(a);
    if (it->second) take_value(i, flag);
  }
  return out;
}

std::string help_with_llama_spellings(const std::string& help, const std::vector<CliOptionInfo>& options) {
  const Known known = index_options(options);
  std::istringstream in(help);
  std::string result;
  for (std::string line; std::getline(in, line);) {
    for (const auto& alias : llama_flag_aliases()) {
      if (!known.longs.count(alias.target)) continue;
      std::string dash1;  // the single-dash spellings, "-ngl"
      for (const auto& s : split_words(alias.spellings))
        if (s.rfind("--", 0) != 0) dash1 += (dash1.empty() ? "" : ", ") + s;
      if (dash1.empty()) continue;
      // cxxopts writes an option without a short name as "      --name".
      const std::string plain = std::string("      --") + alias.target;
      if (line.rfind(plain, 0) != 0 || (line.size() > plain.size() && line[plain.size()] != ' ')) continue;
      std::string shown;
      if (dash1 == std::string("-") + alias.target) {
        shown = std::string("       -") + alias.target;  // "--npl" is the same word: show "-npl" alone
      } else {
        shown = "  " + dash1 + ", --" + alias.target;
      }
      std::string rest = line.substr(plain.size());
      // Keep the description column: take the growth out of the padding
      // before it, or move the description to a line of its own.
      const size_t grow = shown.size() - plain.size();
      const size_t gap = rest.find("  ");
      size_t spaces = 0;
      if (gap != std::string::npos)
        while (gap + spaces < rest.size() && rest[gap + spaces] == ' ') ++spaces;
      if (gap == std::string::npos || spaces == 0) {
        line = shown + rest;
      } else if (spaces > grow + 1) {
        line = shown + rest.erase(gap, grow);
      } else {
        const size_t desc_col = plain.size() + gap + spaces;
        line = shown + rest.substr(0, gap) + "\n" + std::string(desc_col, ' ') + rest.substr(gap + spaces);
      }
      break;
    }
    result += line + "\n";
  }
  return result;
}

}  // namespace runlm
