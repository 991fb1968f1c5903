// Continuous batching gives each request the same tokens as running it alone
// with generate: greedy and seeded sampling, with prefix sharing and with
// preemption when the KV pool is too small. And `runlm batch` end to end.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "batch_input.h"
#include "batch_record.h"
#include "engine.h"
#include "generation.h"
#include "model.h"
#include "sampler.h"
#include "scheduler.h"
#include "test_support.h"
#include "tokenizer.h"

using namespace runlm;
using namespace runlm::test;

namespace {

const std::vector<std::string> kPrompts = {
    "Once upon a time, there was a little girl named Lily.",
    "Once upon a time, there was a little girl named Lily. She loved to play",
    "Tom had a big red ball.",
    "The cat sat on the mat and",
    "One day, a boy named Tim went to the park with his mom and dad to play on the swings.",
};

std::vector<int> alone(const Model& m, const std::vector<int>& prompt, const SamplingParams& sp, int n,
                       int window = -1) {
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.n_threads = 2;
  eo.n_ctx = 512;
  eo.sliding_window = window;
  auto engine = make_cpu_engine(m, eo);
  Sampler sampler(sp);
  GenerationRequest req;
  req.prompt = prompt;
  req.n_predict = n;
  return generate(*engine, sampler, m.tokenizer(), req, nullptr).tokens;
}

std::map<int, Completion> batched(const Model& m, const std::vector<Request>& reqs, int parallel, int64_t pages,
                                  int64_t* preemptions = nullptr, int window = -1, bool swa_full = false,
                                  int* peak_pages = nullptr) {
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.n_threads = 2;
  eo.n_ctx = 512;
  eo.kv = KvLayout::Paged;
  eo.block_size = 16;
  eo.kv_pages = pages;
  eo.sliding_window = window;
  auto engine = make_cpu_engine(m, eo);
  SchedulerOptions so;
  so.max_parallel = parallel;
  so.max_seq_len = 512;
  so.swa_full = swa_full;
  Scheduler s(*engine, m.tokenizer(), so);
  for (const auto& r : reqs) s.submit(r);
  std::map<int, Completion> out;
  int peak = 0;
  s.run([&](Completion&& c) { out[c.index] = std::move(c); }, nullptr, [&](const SchedulerProgress&) {
    peak = std::max(peak, engine->blocks()->n_pages() - engine->blocks()->n_free());
  });
  if (peak_pages) *peak_pages = peak;
  EXPECT_EQ(engine->blocks()->n_free(), engine->blocks()->n_pages()) << "every page is returned";
  if (preemptions) *preemptions = s.preemptions();
  return out;
}

std::vector<Request> requests(const Model& m, const SamplingParams& sp, int n) {
  std::vector<Request> reqs;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    Request r;
    r.index = static_cast<int>(i);
    r.prompt = m.tokenizer().encode(kPrompts[i], true);
    r.n_predict = n + static_cast<int>(i) * 7;  // different lengths: sequences finish at different steps
    r.sampling = sp;
    r.sampling.seed = 1000 + i;
    reqs.push_back(r);
  }
  return reqs;
}

}  // namespace

TEST(Batch, GreedyResultsEqualRunningEachAlone) {
  auto model = Model::load(shared_model("stories260K.gguf"));
  SamplingParams sp;
  sp.temperature = 0;
  const auto reqs = requests(*model, sp, 40);
  const auto out = batched(*model, reqs, 3, 256);
  ASSERT_EQ(out.size(), reqs.size());
  for (const auto& r : reqs) {
    EXPECT_EQ(out.at(r.index).tokens, alone(*model, r.prompt, r.sampling, r.n_predict)) << kPrompts[r.index];
    EXPECT_EQ(out.at(r.index).finish, FinishReason::Length);
  }
  // The second prompt starts with the first's 16-token page... only when run
  // after it has committed; with 3 parallel they start together, so nothing
  // is asserted about sharing here (see PrefixSharing below).
}

TEST(Batch, SeededSamplingEqualsRunningEachAlone) {
  auto model = Model::load(shared_model("stories260K.gguf"));
  SamplingParams sp;
  sp.temperature = 0.9f;
  const auto reqs = requests(*model, sp, 30);
  const auto out = batched(*model, reqs, 4, 256);
  for (const auto& r : reqs)
    EXPECT_EQ(out.at(r.index).tokens, alone(*model, r.prompt, r.sampling, r.n_predict)) << kPrompts[r.index];
}

TEST(Batch, PreemptionWhenPagesRunOutChangesNoResult) {
  auto model = Model::load(shared_model("stories260K.gguf"));
  SamplingParams sp;
  sp.temperature = 0;
  const auto reqs = requests(*model, sp, 60);
  int64_t preemptions = 0;
  // 14 pages of 16 tokens: not enough for 5 sequences of ~70-120 tokens at once.
  const auto out = batched(*model, reqs, 5, 14, &preemptions);
  EXPECT_GT(preemptions, 0);
  for (const auto& r : reqs)
    EXPECT_EQ(out.at(r.index).tokens, alone(*model, r.prompt, r.sampling, r.n_predict)) << kPrompts[r.index];
}

// The bench hook (SchedulerOptions::prefill_first): with a token budget of 8
// the prompts take many steps; no sequence decodes until every one has its
// first token, first_tokens counts them, and the tokens do not change.
TEST(Batch, PrefillFirstKeepsDecodeOutOfPrefill) {
  auto model = Model::load(shared_model("stories260K.gguf"));
  SamplingParams sp;
  sp.temperature = 0;
  const auto reqs = requests(*model, sp, 10);
  for (bool prefill_first : {false, true}) {
    SCOPED_TRACE(prefill_first);
    EngineOptions eo;
    eo.device = Device::Cpu;
    eo.n_threads = 2;
    eo.n_ctx = 512;
    eo.n_batch = 8;
    eo.kv = KvLayout::Paged;
    eo.kv_pages = 256;
    auto engine = make_cpu_engine(*model, eo);
    SchedulerOptions so;
    so.max_parallel = static_cast<int>(reqs.size());
    so.max_seq_len = 512;
    so.prefill_first = prefill_first;
    Scheduler s(*engine, model->tokenizer(), so);
    for (const auto& r : reqs) s.submit(r);
    std::map<int, Completion> out;
    bool decoded_during_prefill = false;
    int last_first_tokens = 0;
    s.run([&](Completion&& c) { out[c.index] = std::move(c); }, nullptr, [&](const SchedulerProgress& p) {
      EXPECT_GE(p.first_tokens, last_first_tokens);
      last_first_tokens = p.first_tokens;
      if (p.first_tokens < p.total && p.tokens_generated > p.first_tokens) decoded_during_prefill = true;
    });
    EXPECT_EQ(last_first_tokens, static_cast<int>(reqs.size()));
    EXPECT_EQ(decoded_during_prefill, !prefill_first);
    for (const auto& r : reqs) EXPECT_EQ(out.at(r.index).tokens, alone(*model, r.prompt, r.sampling, r.n_predict));
  }
}

TEST(Batch, PrefixSharingReusesPagesOfAFinishedPrompt) {
  auto model = Model::load(shared_model("stories260K.gguf"));
  SamplingParams sp;
  sp.temperature = 0;
  std::vector<Request> reqs;
  const std::string system = "Lily and Tom were best friends. They liked to play in the park every day after school.";
  for (int i = 0; i < 3; ++i) {
    Request r;
    r.index = i;
    r.prompt = model->tokenizer().encode(system + (i == 0 ? " One day" : i == 1 ? " Then" : " At night"), true);
    r.n_predict = 10;
    r.sampling = sp;
    reqs.push_back(r);
  }
  const auto out = batched(*model, reqs, 1, 64);  // one at a time: each finds the previous one's pages
  EXPECT_EQ(out.at(0).n_prompt_cached, 0);
  EXPECT_GE(out.at(1).n_prompt_cached, 16);
  for (const auto& r : reqs) EXPECT_EQ(out.at(r.index).tokens, alone(*model, r.prompt, r.sampling, r.n_predict));
}

// A window of 32 tokens: pages that leave every query's window go back to
// the pool, so each sequence holds about window / block_size + 2 pages, and
// the tokens are those of a full-cache run with the same window.
TEST(Batch, SlidingWindowReleasesPagesAndKeepsResults) {
  auto model = Model::load(shared_model("stories260K.gguf"));
  SamplingParams sp;
  sp.temperature = 0;
  auto reqs = requests(*model, sp, 120);
  int peak_released = 0, peak_full = 0;
  const auto released = batched(*model, reqs, 5, 256, nullptr, 32, false, &peak_released);
  const auto full = batched(*model, reqs, 5, 256, nullptr, 32, true, &peak_full);
  for (const auto& r : reqs) {
    EXPECT_EQ(released.at(r.index).tokens, full.at(r.index).tokens);
    EXPECT_EQ(released.at(r.index).tokens, alone(*model, r.prompt, r.sampling, r.n_predict, 32)) << kPrompts[r.index];
  }
  EXPECT_LE(peak_released, 5 * (32 / 16 + 2));
  EXPECT_GT(peak_full, 2 * peak_released);
}

TEST(Batch, JsonLinesParseAndBadLinesBecomeErrors) {
  auto ok = parse_batch_json_line(R"({"prompt": "hi", "n_predict": 5, "temperature": 0, "stop": ["\n"], "id": "a"})", 1);
  EXPECT_TRUE(ok.error.empty()) << ok.error;
  EXPECT_EQ(ok.prompt, "hi");
  EXPECT_EQ(*ok.n_predict, 5);
  EXPECT_EQ(ok.stop.size(), 1u);
  EXPECT_EQ(ok.id, "\"a\"");
  auto chat = parse_batch_json_line(R"({"messages": [{"role": "user", "content": "hi"}]})", 2);
  EXPECT_TRUE(chat.error.empty());
  EXPECT_TRUE(chat.is_chat());
  for (const char* bad : {"{not json", "[1, 2]", R"({"prompt": 5})", R"({"n_predict": 5})",
                          R"({"prompt": "a", "messages": []})", R"({"prompt": "a", "temperature": "hot"})",
                          R"({"prompt": "a", "top_p": 3})", R"({"prompt": "a", "stop": [1]})",
                          R"({"messages": [{"role": "user"}]})", R"({"prompt": "a", "n_predict": 1.5})"}) {
    EXPECT_FALSE(parse_batch_json_line(bad, 3).error.empty()) << bad;
  }
}

TEST(Batch, CliWritesRecordsInInputOrderWithErrorsInPlace) {
  TempPath in(".jsonl"), out(".jsonl");
  {
    std::ofstream f(in.str());
    f << R"({"prompt": "Once upon a time", "n_predict": 12, "id": 1})" << "\n";
    f << R"({"prompt": 42})" << "\n";
    f << "\n";
    f << R"({"prompt": "Tom had a big red ball.", "n_predict": 30, "stop": ["."]})" << "\n";
    f << R"({"messages": [{"role": "user", "content": "Tell me a story"}], "n_predict": 8})" << "\n";
  }
  const CommandResult r = run_command(runlm_binary() + " batch -m " + shared_model("stories260K.gguf") + " -f " +
                                      in.str() + " -o " + out.str() + " --temp 0 -t 2 -np 2 --chat-template llama2");
  // One request failed: exit code 2 (0 only when every request succeeded).
  ASSERT_EQ(r.exit_code, 2) << r.err;
  std::ifstream f(out.str());
  std::vector<nlohmann::json> recs;
  std::string line;
  while (std::getline(f, line)) recs.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(recs.size(), 4u);
  EXPECT_EQ(recs[0]["id"], 1);
  EXPECT_EQ(recs[0]["tokens_out"], 12);
  EXPECT_EQ(recs[0]["finish_reason"], "length");
  EXPECT_TRUE(recs[1].contains("error"));
  EXPECT_EQ(recs[1]["line"], 2);
  // Requests without an id get none (never the line number, which could be
  // another request's id); "line" says where they were.
  EXPECT_FALSE(recs[1].contains("id")) << recs[1];
  EXPECT_FALSE(recs[2].contains("id")) << recs[2];
  EXPECT_EQ(recs[0]["line"], 1);
  EXPECT_EQ(recs[2]["line"], 4);
  EXPECT_EQ(recs[2]["finish_reason"], "stop");
  EXPECT_EQ(recs[2]["text"].get<std::string>().find('.'), std::string::npos);
  EXPECT_EQ(recs[3]["line"], 5);
  EXPECT_TRUE(recs[3].contains("text"));
  EXPECT_NE(r.err.find("1 errors"), std::string::npos) << r.err;

  // The same greedy output as generate.
  const CommandResult g = run_command(runlm_binary() + " generate -m " + shared_model("stories260K.gguf") +
                                      " -p 'Once upon a time' -n 12 --temp 0 -t 2 --no-display-prompt");
  ASSERT_EQ(g.exit_code, 0);
  EXPECT_EQ(recs[0]["text"].get<std::string>() + "\n", g.out);
}

TEST(Batch, CliPlainTextInputAndMissingFile) {
  TempPath in(".txt"), out(".jsonl");
  {
    std::ofstream f(in.str());
    f << "Once upon a time\nThe dog ran\n";
  }
  const CommandResult r = run_command(runlm_binary() + " batch -m " + shared_model("stories260K.gguf") + " -f " +
                                      in.str() + " -o " + out.str() + " -n 5 --temp 0 -t 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string text = read_file(out.str());
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
  const CommandResult bad = run_command(runlm_binary() + " batch -m " + shared_model("stories260K.gguf") +
                                        " -f /nonexistent/prompts.txt");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("/nonexistent/prompts.txt"), std::string::npos);
}

TEST(Batch, UnknownFieldsAreErrorsNamingThem) {
  const auto typo = parse_batch_json_line(R"({"prompt": "hi", "n_predit": 4, "id": "x"})", 3);
  EXPECT_NE(typo.error.find("unknown field \"n_predit\""), std::string::npos) << typo.error;
  EXPECT_NE(typo.error.find("did you mean \"n_predict\""), std::string::npos) << typo.error;
  EXPECT_EQ(typo.id, "\"x\"");  // the request's own id is still read
  const auto far = parse_batch_json_line(R"({"prompt": "hi", "colour": "red"})", 1);
  EXPECT_NE(far.error.find("unknown field \"colour\""), std::string::npos) << far.error;
  EXPECT_EQ(far.error.find("did you mean"), std::string::npos) << far.error;
  const auto allowed = parse_batch_json_line(R"({"prompt": "hi", "n_predit": 4})", 1, /*allow_extra_fields=*/true);
  EXPECT_TRUE(allowed.error.empty()) << allowed.error;
  EXPECT_FALSE(allowed.n_predict.has_value());
  // A line that is not JSON has no readable id: the record carries only its line.
  const auto bad = parse_batch_json_line("{\"id\": 7, ", 2);
  EXPECT_TRUE(bad.id.empty());
  const auto rec = nlohmann::json::parse(batch_error_record(bad, bad.error));
  EXPECT_FALSE(rec.contains("id")) << rec;
  EXPECT_EQ(rec["line"], 2);
}

TEST(Batch, CliExitCodeSaysWhetherEveryRequestSucceeded) {
  TempPath in(".jsonl"), out(".jsonl");
  const std::string run = runlm_binary() + " batch -m " + shared_model("stories260K.gguf") + " -f " + in.str() +
                          " -o " + out.str() + " --temp 0 -t 2 -np 2";
  {
    std::ofstream f(in.str());
    f << R"({"prompt": "Once upon a time", "n_predict": 4, "id": 1})" << "\n";
    f << R"({"prompt": "Tom had a ball", "n_predict": 4, "id": 2})" << "\n";
  }
  const CommandResult ok = run_command(run);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.err.find("batch: 2 requests: 2 done, 0 errors, 0 interrupted, 0 not started"), std::string::npos)
      << ok.err;
  {
    std::ofstream f(in.str());
    f << R"({"prompt": "Once upon a time", "n_predict": 4, "id": 1})" << "\n";
    f << R"({"prompt": "Tom had a ball", "n_predit": 4, "id": 2})" << "\n";
    f << "not json\n";
  }
  const CommandResult some = run_command(run);
  EXPECT_EQ(some.exit_code, 2) << some.err;
  EXPECT_NE(some.err.find("batch: 3 requests: 1 done, 2 errors"), std::string::npos) << some.err;
  std::ifstream f(out.str());
  std::vector<nlohmann::json> recs;
  for (std::string line; std::getline(f, line);) recs.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[1]["id"], 2);
  EXPECT_NE(recs[1]["error"].get<std::string>().find("n_predit"), std::string::npos);
  EXPECT_FALSE(recs[2].contains("id")) << recs[2];  // never the line number as a made-up id
  EXPECT_EQ(recs[2]["line"], 3);
  // --allow-extra-fields runs the misspelt request with the defaults.
  const CommandResult extra = run_command(run + " --allow-extra-fields -n 2");
  EXPECT_EQ(extra.exit_code, 2) << extra.err;  // the line that is not JSON still fails
  EXPECT_NE(extra.err.find("2 done, 1 errors"), std::string::npos) << extra.err;
}
