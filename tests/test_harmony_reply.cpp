// gpt-oss's harmony replies: the answer taken back into the conversation is
// the final channel's text alone.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "batch_record.h"
#include "harmony_reply.h"

using runlm::harmony_final_text;

TEST(HarmonyReply, AnalysisThenFinalGivesTheFinalText) {
  EXPECT_EQ(harmony_final_text("<|channel|>analysis<|message|>The user greets; answer briefly.<|end|>"
                               "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?"),
            "Hello! How can I help?");
  // A reply that ends on the final message's <|end|> (a template that asks
  // for it) or has several messages: the last final one.
  EXPECT_EQ(harmony_final_text("<|channel|>final<|message|>first<|end|><|start|>assistant<|channel|>analysis"
                               "<|message|>more<|end|><|start|>assistant<|channel|>final<|message|>second<|end|>"),
            "second");
}

TEST(HarmonyReply, HeadersAfterTheChannelNameAreNotPartOfIt) {
  EXPECT_EQ(harmony_final_text("<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|end|>"
                               "<|start|>assistant<|channel|>final <|constrain|>text<|message|>It is noon."),
            "It is noon.");
  // "finally" is another channel, not final.
  EXPECT_EQ(harmony_final_text("<|channel|>finally<|message|>no"), "");
}

TEST(HarmonyReply, ReplyCutShortInItsAnalysisHasNoAnswer) {
  EXPECT_EQ(harmony_final_text("<|channel|>analysis<|message|>Let me think about"), "");
  EXPECT_EQ(harmony_final_text("<|channel|>analysis<|message|>done<|end|><|start|>assistant<|chan"), "");
  EXPECT_EQ(harmony_final_text("<|channel|>"), "");
}

TEST(HarmonyReply, OtherRepliesStayAsTheyAre) {
  for (const char* r : {"", "Hello there.", " <|channel|>final<|message|>x", "<think>hm</think>Hi"}) {
    EXPECT_FALSE(runlm::is_harmony_reply(r));
    EXPECT_EQ(harmony_final_text(r), r);
  }
}

// runlm batch: a harmony reply to a conversation also carries its answer
// alone in "content"; a plain prompt's reply, or a reply in another format,
// has only "text".
TEST(HarmonyReply, BatchRecordsCarryTheAnswerOfAConversation) {
  runlm::BatchEntry chat;
  chat.messages = {{"user", "Hi"}};
  runlm::BatchEntry plain;
  plain.prompt = "Hi";
  runlm::Completion c;
  c.text = "<|channel|>analysis<|message|>Greet back.<|end|><|start|>assistant<|channel|>final<|message|>Hello!";
  auto record = [](const runlm::BatchEntry& e, const runlm::Completion& c) {
    return nlohmann::json::parse(runlm::batch_completion_record(e, c));
  };
  const nlohmann::json r = record(chat, c);
  EXPECT_EQ(r["text"], c.text);
  EXPECT_EQ(r["content"], "Hello!");
  EXPECT_FALSE(record(plain, c).contains("content"));
  c.text = "Hello!";
  EXPECT_FALSE(record(chat, c).contains("content"));
}
