#include "common/tokenizer/pre_tokenizer.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/unicode.h"

namespace tandem::tokenizer_internal {
namespace {

using nlohmann::json;

// GPT-2's pre-tokenization pattern (ByteLevel with use_regex).
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

absl::StatusOr<SplitBehavior> ParseBehavior(const json& j, SplitBehavior fallback,
                                            const char* what) {
  if (!j.contains("behavior") || j["behavior"].is_null()) return fallback;
  if (!j["behavior"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": \"behavior\" must be a string"));
  }
  const std::string b = j["behavior"].get<std::string>();
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(absl::StrCat(what, ": unsupported behavior '", b, "'"));
}

// Ranges of single code points satisfying `pred`.
template <typename Pred>
std::vector<std::pair<size_t, size_t>> CharMatches(const std::string& s, Pred pred) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    const int32_t cp = unicode::DecodeAt(s, i, &len);
    if (pred(cp)) out.emplace_back(i, i + len);
    i += len;
  }
  return out;
}

void ForEachPiece(std::vector<Piece>* pieces,
                  const std::function<std::vector<Piece>(const Piece&)>& split) {
  std::vector<Piece> out;
  out.reserve(pieces->size());
  for (const Piece& p : *pieces) {
    for (Piece& q : split(p)) out.push_back(std::move(q));
  }
  *pieces = std::move(out);
}

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, std::unique_ptr<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  void Apply(std::vector<Piece>* pieces) const override {
    ForEachPiece(pieces, [&](const Piece& p) {
      Piece src = p;
      if (add_prefix_space_ && !src.text.starts_with(' ')) src.text.insert(0, " ");
      std::vector<Piece> parts =
          regex_ ? SplitPiece(src, regex_->FindAll(src.text), SplitBehavior::kIsolated, false)
                 : std::vector<Piece>{src};
      for (Piece& q : parts) q.text = ByteLevelEncode(q.text);
      return parts;
    });
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;  // null when use_regex is false
};

class Split final : public PreTokenizer {
 public:
  Split(std::unique_ptr<Regex> regex, SplitBehavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  void Apply(std::vector<Piece>* pieces) const override {
    ForEachPiece(pieces, [&](const Piece& p) {
      return SplitPiece(p, regex_->FindAll(p.text), behavior_, invert_);
    });
  }

 private:
  std::unique_ptr<Regex> regex_;
  SplitBehavior behavior_;
  bool invert_;
};

class CharSplit final : public PreTokenizer {
 public:
  CharSplit(std::function<bool(int32_t)> pred, SplitBehavior behavior)
      : pred_(std::move(pred)), behavior_(behavior) {}
  void Apply(std::vector<Piece>* pieces) const override {
    ForEachPiece(pieces, [&](const Piece& p) {
      return SplitPiece(p, CharMatches(p.text, pred_), behavior_, false);
    });
  }

 private:
  std::function<bool(int32_t)> pred_;
  SplitBehavior behavior_;
};

class Metaspace final : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  Metaspace(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(split) {}
  void Apply(std::vector<Piece>* pieces) const override {
    ForEachPiece(pieces, [&](const Piece& p) {
      Piece q = p;
      std::string replaced;
      for (char c : q.text) {
        if (c == ' ') {
          replaced += replacement_;
        } else {
          replaced.push_back(c);
        }
      }
      q.text = std::move(replaced);
      const bool prepend =
          prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && q.at_start);
      if (prepend && !q.text.starts_with(replacement_)) q.text.insert(0, replacement_);
      if (!split_) return std::vector<Piece>{q};
      std::vector<std::pair<size_t, size_t>> delims;
      for (size_t pos = q.text.find(replacement_); pos != std::string::npos;
           pos = q.text.find(replacement_, pos + replacement_.size())) {
        delims.emplace_back(pos, pos + replacement_.size());
      }
      return SplitPiece(q, delims, SplitBehavior::kMergedWithNext, false);
    });
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void Apply(std::vector<Piece>* pieces) const override {
    for (const auto& p : parts_) p->Apply(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

std::string ByteLevelEncode(std::string_view s) {
  static const std::vector<std::string>* table = [] {
    auto* t = new std::vector<std::string>(256);
    for (int b = 0; b < 256; ++b) (*t)[b] = EncodeUtf8(ByteLevelCodePoints()[b]);
    return t;
  }();
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) out += (*table)[c];
  return out;
}

std::vector<Piece> SplitPiece(const Piece& piece,
                              const std::vector<std::pair<size_t, size_t>>& delimiters,
                              SplitBehavior behavior, bool invert) {
  // Segments covering the whole piece, each flagged as delimiter or not.
  struct Segment {
    size_t begin, end;
    bool is_delim;
  };
  std::vector<Segment> segs;
  size_t last = 0;
  for (auto [b, e] : delimiters) {
    if (b > last) segs.push_back({last, b, invert});
    segs.push_back({b, e, !invert});
    last = e;
  }
  if (last < piece.text.size()) segs.push_back({last, piece.text.size(), invert});

  std::vector<std::pair<size_t, size_t>> ranges;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Segment& s : segs) {
        if (!s.is_delim) ranges.emplace_back(s.begin, s.end);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Segment& s : segs) ranges.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_delim = false;
      for (const Segment& s : segs) {
        if (s.is_delim && !previous_delim && !ranges.empty()) {
          ranges.back().second = s.end;
        } else {
          ranges.emplace_back(s.begin, s.end);
        }
        previous_delim = s.is_delim;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool next_delim = false;
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->is_delim && !next_delim && !ranges.empty()) {
          ranges.back().first = it->begin;
        } else {
          ranges.emplace_back(it->begin, it->end);
        }
        next_delim = it->is_delim;
      }
      std::reverse(ranges.begin(), ranges.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_delim = false;
      for (size_t i = 0; i < segs.size(); ++i) {
        if (i > 0 && segs[i].is_delim == previous_delim) {
          ranges.back().second = segs[i].end;
        } else {
          ranges.emplace_back(segs[i].begin, segs[i].end);
        }
        previous_delim = segs[i].is_delim;
      }
      break;
    }
  }
  std::vector<Piece> out;
  out.reserve(ranges.size());
  for (auto [b, e] : ranges) {
    if (e > b) out.push_back({piece.text.substr(b, e - b), piece.at_start && b == 0});
  }
  return out;
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const json& j) {
  if (j.is_null()) return nullptr;
  ASSIGN_OR_RETURN(std::string type, TypeOf(j, "pre_tokenizer"));
  if (type == "ByteLevel") {
    ASSIGN_OR_RETURN(bool add_prefix_space,
                     GetBool(j, "add_prefix_space", true, "ByteLevel pre_tokenizer"));
    ASSIGN_OR_RETURN(bool use_regex, GetBool(j, "use_regex", true, "ByteLevel pre_tokenizer"));
    std::unique_ptr<Regex> regex;
    if (use_regex) {
      ASSIGN_OR_RETURN(regex, Regex::Compile(kGpt2Pattern));
    }
    return std::make_unique<ByteLevel>(add_prefix_space, std::move(regex));
  }
  if (type == "Split") {
    ASSIGN_OR_RETURN(auto regex, ParsePattern(j, "Split pre_tokenizer"));
    ASSIGN_OR_RETURN(SplitBehavior behavior,
                     ParseBehavior(j, SplitBehavior::kIsolated, "Split pre_tokenizer"));
    ASSIGN_OR_RETURN(bool invert, GetBool(j, "invert", false, "Split pre_tokenizer"));
    return std::make_unique<Split>(std::move(regex), behavior, invert);
  }
  if (type == "Metaspace") {
    std::string replacement = "\xE2\x96\x81";
    if (j.contains("replacement")) {
      ASSIGN_OR_RETURN(replacement, GetString(j, "replacement", "Metaspace pre_tokenizer"));
    }
    Metaspace::Prepend prepend = Metaspace::Prepend::kAlways;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      const std::string s = j["prepend_scheme"].get<std::string>();
      if (s == "always")
        prepend = Metaspace::Prepend::kAlways;
      else if (s == "first")
        prepend = Metaspace::Prepend::kFirst;
      else if (s == "never")
        prepend = Metaspace::Prepend::kNever;
      else
        return absl::InvalidArgumentError(
            absl::StrCat("Metaspace pre_tokenizer: unsupported prepend_scheme '", s, "'"));
    } else {
      ASSIGN_OR_RETURN(bool add_prefix_space,
                       GetBool(j, "add_prefix_space", true, "Metaspace pre_tokenizer"));
      prepend = add_prefix_space ? Metaspace::Prepend::kAlways : Metaspace::Prepend::kNever;
    }
    ASSIGN_OR_RETURN(bool split, GetBool(j, "split", true, "Metaspace pre_tokenizer"));
    return std::make_unique<Metaspace>(std::move(replacement), prepend, split);
  }
  if (type == "Digits") {
    ASSIGN_OR_RETURN(bool individual,
                     GetBool(j, "individual_digits", false, "Digits pre_tokenizer"));
    return std::make_unique<CharSplit>(
        [](int32_t cp) { return unicode::IsDigit(cp); },
        individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
  }
  if (type == "Punctuation") {
    ASSIGN_OR_RETURN(SplitBehavior behavior,
                     ParseBehavior(j, SplitBehavior::kIsolated, "Punctuation pre_tokenizer"));
    return std::make_unique<CharSplit>([](int32_t cp) { return unicode::IsPunctuation(cp); },
                                       behavior);
  }
  if (type == "Whitespace") {
    ASSIGN_OR_RETURN(auto regex, Regex::Compile(R"(\w+|[^\w\s]+)"));
    return std::make_unique<Split>(std::move(regex), SplitBehavior::kRemoved, /*invert=*/true);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<CharSplit>([](int32_t cp) { return unicode::IsWhitespace(cp); },
                                       SplitBehavior::kRemoved);
  }
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      return absl::InvalidArgumentError("Sequence pre_tokenizer without a \"pretokenizers\" list");
    }
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const json& part : j["pretokenizers"]) {
      ASSIGN_OR_RETURN(auto p, ParsePreTokenizer(part));
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported pre_tokenizer type '", type, "'"));
}

}  // namespace tandem::tokenizer_internal
