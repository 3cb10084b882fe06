#include "common/tokenizer/normalizer.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/unicode.h"

namespace tandem::tokenizer_internal {
namespace {

using nlohmann::json;

class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(unicode::Form f) : form_(f) {}
  std::string Normalize(std::string s) const override { return unicode::Normalize(s, form_); }

 private:
  unicode::Form form_;
};

class Lowercase final : public Normalizer {
 public:
  std::string Normalize(std::string s) const override { return unicode::Lowercase(s); }
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  std::string Normalize(std::string s) const override {
    size_t b = 0, e = s.size();
    if (left_) {
      while (b < e) {
        size_t len;
        if (!unicode::IsWhitespace(unicode::DecodeAt(s, b, &len))) break;
        b += len;
      }
    }
    if (right_) {
      while (e > b) {
        size_t start = e - 1;
        while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        size_t len;
        if (!unicode::IsWhitespace(unicode::DecodeAt(s, start, &len))) break;
        e = start;
      }
    }
    return s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string p) : prepend_(std::move(p)) {}
  std::string Normalize(std::string s) const override {
    return s.empty() ? s : prepend_ + s;  // the reference leaves empty input alone
  }

 private:
  std::string prepend_;
};

class Replace final : public Normalizer {
 public:
  Replace(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string Normalize(std::string s) const override { return pattern_->ReplaceAll(s, content_); }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  std::string Normalize(std::string s) const override {
    for (const auto& p : parts_) s = p->Normalize(std::move(s));
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const json& j) {
  if (j.is_null()) return nullptr;
  ASSIGN_OR_RETURN(std::string type, TypeOf(j, "normalizer"));
  if (type == "NFC") return std::make_unique<UnicodeForm>(unicode::Form::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeForm>(unicode::Form::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(unicode::Form::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(unicode::Form::kNfkd);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Strip") {
    ASSIGN_OR_RETURN(bool left, GetBool(j, "strip_left", true, "Strip normalizer"));
    ASSIGN_OR_RETURN(bool right, GetBool(j, "strip_right", true, "Strip normalizer"));
    return std::make_unique<Strip>(left, right);
  }
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string p, GetString(j, "prepend", "Prepend normalizer"));
    return std::make_unique<Prepend>(std::move(p));
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(auto pattern, ParsePattern(j, "Replace normalizer"));
    ASSIGN_OR_RETURN(std::string content, GetString(j, "content", "Replace normalizer"));
    return std::make_unique<Replace>(std::move(pattern), std::move(content));
  }
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array()) {
      return absl::InvalidArgumentError("Sequence normalizer without a \"normalizers\" list");
    }
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const json& part : j["normalizers"]) {
      ASSIGN_OR_RETURN(auto n, ParseNormalizer(part));
      if (n) parts.push_back(std::move(n));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported normalizer type '", type, "'"));
}

}  // namespace tandem::tokenizer_internal
