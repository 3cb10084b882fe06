#include "common/tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/unicode.h"

namespace tandem::tokenizer_internal {

using nlohmann::json;

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Parse(const json& j) {
  ASSIGN_OR_RETURN(std::string type, TypeOf(j, "model"));
  if (type != "BPE") {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported model type '", type, "' (supported: BPE)"));
  }
  if (j.contains("dropout") && j["dropout"].is_number() && j["dropout"].get<double>() > 0) {
    return absl::InvalidArgumentError("unsupported BPE dropout (it makes encoding random)");
  }
  std::unique_ptr<BpeModel> m(new BpeModel());
  if (!j.contains("vocab") || !j["vocab"].is_object()) {
    return absl::InvalidArgumentError("BPE model: \"vocab\" must be an object of token → id");
  }
  m->vocab_.reserve(j["vocab"].size());
  for (const auto& [token, id] : j["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 30)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "BPE model: token id of \"", token.substr(0, 64), "\" must be an integer in [0, 2^30)"));
    }
    const int32_t v = id.get<int32_t>();
    m->vocab_[token] = v;
    m->max_id_ = std::max<int64_t>(m->max_id_, v);
  }
  m->id_to_token_.assign(static_cast<size_t>(m->max_id_ + 1), nullptr);
  for (const auto& [token, id] : m->vocab_) m->id_to_token_[id] = &token;

  auto optional_string = [&](const char* key) -> std::string {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
  };
  m->continuing_subword_prefix_ = optional_string("continuing_subword_prefix");
  m->end_of_word_suffix_ = optional_string("end_of_word_suffix");
  ASSIGN_OR_RETURN(m->byte_fallback_, GetBool(j, "byte_fallback", false, "BPE model"));
  ASSIGN_OR_RETURN(m->fuse_unk_, GetBool(j, "fuse_unk", false, "BPE model"));
  ASSIGN_OR_RETURN(m->ignore_merges_, GetBool(j, "ignore_merges", false, "BPE model"));
  if (const std::string unk = optional_string("unk_token"); !unk.empty()) {
    auto it = m->vocab_.find(unk);
    if (it == m->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("BPE model: unk_token \"", unk, "\" is not in the vocabulary"));
    }
    m->unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = m->vocab_.find(name);
    m->byte_ids_[b] = it == m->vocab_.end() ? -1 : it->second;
  }

  const std::string marker = "\xE2\x96\x81";
  if (m->vocab_.contains(marker) && m->continuing_subword_prefix_.empty() &&
      m->end_of_word_suffix_.empty()) {
    bool crossing = false;
    for (const auto& [token, id] : m->vocab_) {
      for (size_t pos = token.find(marker, 1); pos != std::string::npos && !crossing;
           pos = token.find(marker, pos + 1)) {
        crossing =
            pos < marker.size() || token.compare(pos - marker.size(), marker.size(), marker) != 0;
      }
      if (crossing) break;
    }
    if (!crossing) m->word_start_marker_ = marker;
  }

  if (!j.contains("merges") || !j["merges"].is_array()) {
    return absl::InvalidArgumentError("BPE model: \"merges\" must be a list");
  }
  const json& merges = j["merges"];
  m->merges_.reserve(merges.size());
  int32_t rank = 0;
  for (const json& merge : merges) {
    std::string a, b;
    if (merge.is_string()) {
      const std::string s = merge.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("BPE model: merge ", rank, " \"", s.substr(0, 64),
                         "\" is not two tokens separated by one space"));
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      a = merge[0].get<std::string>();
      b = merge[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("BPE model: merge ", rank, " must be \"a b\" or [a, b]"));
    }
    auto ia = m->vocab_.find(a), ib = m->vocab_.find(b);
    std::string merged = a + (b.starts_with(m->continuing_subword_prefix_)
                                  ? b.substr(m->continuing_subword_prefix_.size())
                                  : b);
    auto im = m->vocab_.find(merged);
    if (ia == m->vocab_.end() || ib == m->vocab_.end() || im == m->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("BPE model: merge ", rank, " (\"", a.substr(0, 32), "\", \"",
                       b.substr(0, 32), "\") uses a token missing from the vocabulary"));
    }
    // The first occurrence of a pair wins (lowest rank).
    m->merges_.try_emplace(PairKey(ia->second, ib->second), Merge{rank, im->second});
    ++rank;
  }
  return m;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size())) return nullptr;
  return id_to_token_[id];
}

void BpeModel::Tokenize(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (!word_start_marker_.empty() && piece.size() > kMaxCachedPiece / 4) {
    // Cut before every marker that follows another character (see word_start_marker_).
    const std::string& m = word_start_marker_;
    size_t start = 0;
    for (size_t pos = piece.find(m, 1); pos != std::string_view::npos;
         pos = piece.find(m, pos + m.size())) {
      if (pos >= m.size() && piece.compare(pos - m.size(), m.size(), m) == 0)
        continue;  // inside a run
      TokenizeWord(piece.substr(start, pos - start), out);
      start = pos;
    }
    TokenizeWord(piece.substr(start), out);
    return;
  }
  TokenizeWord(piece, out);
}

void BpeModel::TokenizeWord(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (piece.size() <= kMaxCachedPiece) {
    const std::string key(piece);
    {
      absl::MutexLock lock(&cache_mu_);
      auto it = cache_.find(key);
      if (it != cache_.end()) {
        out->insert(out->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids;
    TokenizeUncached(piece, &ids);
    out->insert(out->end(), ids.begin(), ids.end());
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(key, std::move(ids));
    return;
  }
  TokenizeUncached(piece, out);
}

void BpeModel::TokenizeUncached(std::string_view piece, std::vector<int32_t>* out) const {
  if (ignore_merges_) {
    auto it = vocab_.find(absl::string_view(piece.data(), piece.size()));
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  // Initial symbols: one per character (with prefix / suffix), or its bytes, or unk.
  std::vector<int32_t> symbols;
  symbols.reserve(piece.size());
  bool previous_unk = false;
  std::string lookup;
  for (size_t i = 0; i < piece.size();) {
    size_t len;
    unicode::DecodeAt(piece, i, &len);
    const bool first = i == 0, last = i + len == piece.size();
    lookup.clear();
    if (!first) lookup += continuing_subword_prefix_;
    lookup.append(piece.substr(i, len));
    if (last) lookup += end_of_word_suffix_;
    auto it = vocab_.find(lookup);
    if (it != vocab_.end()) {
      symbols.push_back(it->second);
      previous_unk = false;
    } else {
      bool all_bytes = byte_fallback_;
      for (size_t k = 0; all_bytes && k < len; ++k) {
        all_bytes = byte_ids_[static_cast<unsigned char>(piece[i + k])] >= 0;
      }
      if (all_bytes) {
        for (size_t k = 0; k < len; ++k)
          symbols.push_back(byte_ids_[static_cast<unsigned char>(piece[i + k])]);
        previous_unk = false;
      } else if (unk_id_) {
        if (!(fuse_unk_ && previous_unk)) symbols.push_back(*unk_id_);
        previous_unk = true;
      }
      // Without unk and byte fallback the character is dropped, as the reference does.
    }
    i += len;
  }
  const size_t n = symbols.size();
  if (n <= 1) {
    out->insert(out->end(), symbols.begin(), symbols.end());
    return;
  }
  // Doubly linked list over symbols; a heap of candidate merges ordered by (rank, position).
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t left_id, right_id;  // symbol ids at push time (to detect stale entries)
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(PairKey(symbols[pos], symbols[next[pos]]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, symbols[pos], symbols[next[pos]]});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int32_t r = next[c.pos];
    if (!alive[c.pos] || r < 0 || symbols[c.pos] != c.left_id || symbols[r] != c.right_id) continue;
    symbols[c.pos] = merges_.at(PairKey(c.left_id, c.right_id)).merged_id;
    alive[r] = false;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out->push_back(symbols[i]);
}

}  // namespace tandem::tokenizer_internal
