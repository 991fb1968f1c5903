#include "stop_strings.h"

#include <algorithm>

namespace runlm {

StopStringFilter::StopStringFilter(std::vector<std::string> stop_before, std::vector<std::string> stop_after) {
  for (auto& s : stop_before)
    if (!s.empty()) before_.push_back(std::move(s));
  for (auto& s : stop_after)
    if (!s.empty()) after_.push_back(std::move(s));
}

std::string StopStringFilter::push(const std::string& piece, bool* stopped) {
  *stopped = false;
  text_ += piece;
  // The earliest end of output any stop string asks for. A match starts at
  // or after shown_: any earlier start would have been held back below.
  size_t cut = std::string::npos;
  for (const auto& s : before_) {
    const size_t at = text_.find(s, shown_);
    if (at != std::string::npos && at < cut) cut = at, matched_after_.clear();
  }
  for (const auto& s : after_) {
    const size_t at = text_.find(s, shown_);
    if (at != std::string::npos && at + s.size() < cut) cut = at + s.size(), matched_after_ = s;
  }
  if (cut != std::string::npos) {
    *stopped = true;
    const std::string out = cut > shown_ ? text_.substr(shown_, cut - shown_) : "";
    shown_ = std::max(shown_, cut);
    return out;
  }
  // Hold back the longest tail that is a prefix of some stop string.
  size_t hold = 0;
  for (const auto* list : {&before_, &after_})
    for (const auto& s : *list)
      for (size_t k = std::min(s.size() - 1, text_.size() - shown_); k > hold; --k)
        if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
  const size_t end = text_.size() - hold;
  const std::string out = end > shown_ ? text_.substr(shown_, end - shown_) : "";
  shown_ = std::max(shown_, end);
  return out;
}

std::string StopStringFilter::flush() {
  const std::string out = text_.substr(shown_);
  shown_ = text_.size();
  return out;
}

}  // namespace runlm
