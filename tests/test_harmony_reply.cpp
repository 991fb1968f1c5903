// gpt-oss's harmony replies: the answer taken back into the conversation is
// the final channel's text alone.
#include <gtest/gtest.h>

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
  for (const char* r : {"", "Hello there.", " <|channel|>final<|message|>x", "<think>hm</think>Hi"})
    EXPECT_EQ(harmony_final_text(r), r);
}
