#include "common/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/unicode.h"

namespace tandem::tokenizer_internal {
namespace {

using nlohmann::json;

// Code point ending just before byte offset `end`.
int32_t PreviousCodePoint(std::string_view s, size_t end) {
  if (end == 0) return -1;
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t len;
  return unicode::DecodeAt(s, start, &len);
}

bool IsWordChar(int32_t cp) { return cp == '_' || unicode::IsAlphanumeric(cp); }

}  // namespace

absl::StatusOr<std::unique_ptr<AddedVocabulary>> AddedVocabulary::Parse(const json& j) {
  auto v = std::make_unique<AddedVocabulary>();
  if (j.is_null()) return v;
  if (!j.is_array()) return absl::InvalidArgumentError("\"added_tokens\" must be a list");
  for (const json& t : j) {
    AddedToken a;
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        !t.contains("content") || !t["content"].is_string()) {
      return absl::InvalidArgumentError(
          "added_tokens: each entry needs an integer \"id\" and a string \"content\"");
    }
    const int64_t id = t["id"].get<int64_t>();
    if (id < 0 || id >= (1 << 30))
      return absl::InvalidArgumentError(absl::StrCat("added token id ", id, " out of range"));
    a.id = static_cast<int32_t>(id);
    a.content = t["content"].get<std::string>();
    if (a.content.empty())
      return absl::InvalidArgumentError(absl::StrCat("added token ", id, " has empty content"));
    ASSIGN_OR_RETURN(a.special, GetBool(t, "special", false, "added token"));
    ASSIGN_OR_RETURN(a.lstrip, GetBool(t, "lstrip", false, "added token"));
    ASSIGN_OR_RETURN(a.rstrip, GetBool(t, "rstrip", false, "added token"));
    ASSIGN_OR_RETURN(a.single_word, GetBool(t, "single_word", false, "added token"));
    // The reference defaults "normalized" to the opposite of "special".
    ASSIGN_OR_RETURN(a.normalized, GetBool(t, "normalized", !a.special, "added token"));
    v->has_normalized_ |= a.normalized;
    v->by_id_[a.id] = v->tokens_.size();
    v->by_content_[a.content] = v->tokens_.size();
    v->tokens_.push_back(std::move(a));
  }
  for (size_t i = 0; i < v->tokens_.size(); ++i) {
    v->by_first_byte_[static_cast<unsigned char>(v->tokens_[i].content[0])].push_back(i);
  }
  for (auto& list : v->by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [&](size_t a, size_t b) {
      return v->tokens_[a].content.size() > v->tokens_[b].content.size();
    });
  }
  return v;
}

const AddedToken* AddedVocabulary::Find(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::FindByContent(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

std::vector<TextSegment> AddedVocabulary::Split(std::string_view text, bool normalized_pass) const {
  std::vector<TextSegment> out;
  size_t text_start = 0;  // start of pending normal text
  size_t i = 0;
  while (i < text.size()) {
    const AddedToken* match = nullptr;
    for (size_t idx : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const AddedToken& t = tokens_[idx];
      if (t.normalized != normalized_pass) continue;
      if (text.compare(i, t.content.size(), t.content) != 0) continue;
      if (t.single_word) {
        size_t len;
        const int32_t before = PreviousCodePoint(text, i);
        const size_t end = i + t.content.size();
        const int32_t after = end < text.size() ? unicode::DecodeAt(text, end, &len) : -1;
        if (IsWordChar(before) || IsWordChar(after)) continue;
      }
      match = &t;
      break;
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    size_t begin = i, end = i + match->content.size();
    if (match->lstrip) {
      while (begin > text_start) {
        const size_t cp_start = [&] {
          size_t s = begin - 1;
          while (s > text_start && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
          return s;
        }();
        size_t len;
        if (!unicode::IsWhitespace(unicode::DecodeAt(text, cp_start, &len))) break;
        begin = cp_start;
      }
    }
    if (match->rstrip) {
      while (end < text.size()) {
        size_t len;
        if (!unicode::IsWhitespace(unicode::DecodeAt(text, end, &len))) break;
        end += len;
      }
    }
    if (begin > text_start)
      out.push_back({std::string(text.substr(text_start, begin - text_start)), -1, text_start});
    out.push_back({std::string(text.substr(begin, end - begin)), match->id, begin});
    text_start = i = end;
  }
  if (text_start < text.size())
    out.push_back({std::string(text.substr(text_start)), -1, text_start});
  return out;
}

}  // namespace tandem::tokenizer_internal
