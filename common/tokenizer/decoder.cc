#include "common/tokenizer/decoder.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/unicode.h"

namespace tandem::tokenizer_internal {
namespace {

using nlohmann::json;

// Byte-level characters back to bytes. A token containing any other character (an added token such
// as "<｜begin▁of▁sentence｜>") contributes its UTF-8 bytes unchanged.
class ByteLevel final : public Decoder {
 public:
  ByteLevel() {
    const auto& cps = ByteLevelCodePoints();
    for (int b = 0; b < 256; ++b) cp_to_byte_[cps[b]] = static_cast<uint8_t>(b);
  }
  std::vector<std::string> Decode(std::vector<std::string> tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t mark = bytes.size();
      bool all_mapped = true;
      for (size_t i = 0; i < t.size();) {
        size_t len;
        const int32_t cp = unicode::DecodeAt(t, i, &len);
        auto it = cp_to_byte_.find(cp);
        if (it == cp_to_byte_.end()) {
          all_mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(it->second));
        i += len;
      }
      if (!all_mapped) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    return {unicode::ToValidUtf8(bytes)};
  }
  std::string RawToken(std::string token) const override {
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
      size_t len;
      auto it = cp_to_byte_.find(unicode::DecodeAt(token, i, &len));
      if (it == cp_to_byte_.end()) return token;
      bytes.push_back(static_cast<char>(it->second));
      i += len;
    }
    return bytes;
  }

 private:
  absl::flat_hash_map<int32_t, uint8_t> cp_to_byte_;
};

class Metaspace final : public Decoder {
 public:
  Metaspace(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  std::vector<std::string> Decode(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      // As the reference (Rust) decoder: in the first token every replacement character is dropped
      // (not only a leading one) unless the prepend scheme is "never".
      const bool drop = i == 0 && strip_first_;
      for (size_t pos = 0; pos < t.size();) {
        if (t.compare(pos, replacement_.size(), replacement_) == 0) {
          if (!drop) out.push_back(' ');
          pos += replacement_.size();
        } else {
          out.push_back(t[pos++]);
        }
      }
      tokens[i] = std::move(out);
    }
    return tokens;
  }
  std::string RawToken(std::string token) const override {
    std::string out;
    for (size_t pos = 0; pos < token.size();) {
      if (token.compare(pos, replacement_.size(), replacement_) == 0) {
        out.push_back(' ');
        pos += replacement_.size();
      } else {
        out.push_back(token[pos++]);
      }
    }
    return out;
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

// Runs of "<0xNN>" tokens become their bytes when those form valid UTF-8, else one U+FFFD per byte.
class ByteFallback final : public Decoder {
 public:
  std::vector<std::string> Decode(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    size_t pending_count = 0;
    auto flush = [&] {
      if (pending_count == 0) return;
      if (unicode::IsValidUtf8(pending)) {
        out.push_back(pending);
      } else {
        std::string r;
        for (size_t i = 0; i < pending_count; ++i) r += "\xEF\xBF\xBD";
        out.push_back(r);
      }
      pending.clear();
      pending_count = 0;
    };
    for (std::string& t : tokens) {
      unsigned v;
      if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>' &&
          std::isxdigit(static_cast<unsigned char>(t[3])) &&
          std::isxdigit(static_cast<unsigned char>(t[4])) &&
          std::sscanf(t.c_str() + 3, "%2x", &v) == 1) {
        pending.push_back(static_cast<char>(v));
        ++pending_count;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    return out;
  }
  std::string RawToken(std::string token) const override {
    unsigned v;
    if (token.size() == 6 && token.starts_with("<0x") && token[5] == '>' &&
        std::isxdigit(static_cast<unsigned char>(token[3])) &&
        std::isxdigit(static_cast<unsigned char>(token[4])) &&
        std::sscanf(token.c_str() + 3, "%2x", &v) == 1) {
      return std::string(1, static_cast<char>(v));
    }
    return token;
  }
};

class Fuse final : public Decoder {
 public:
  std::vector<std::string> Decode(std::vector<std::string> tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    return {all};
  }
};

class Strip final : public Decoder {
 public:
  Strip(std::string content, int64_t start, int64_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  std::vector<std::string> Decode(std::vector<std::string> tokens) const override {
    for (std::string& t : tokens) {
      size_t b = 0, e = t.size();
      for (int64_t k = 0; k < start_ && b < e && t.compare(b, content_.size(), content_) == 0;
           ++k) {
        b += content_.size();
      }
      for (int64_t k = 0; k < stop_ && e >= b + content_.size() &&
                          t.compare(e - content_.size(), content_.size(), content_) == 0;
           ++k) {
        e -= content_.size();
      }
      t = t.substr(b, e - b);
    }
    return tokens;
  }

 private:
  std::string content_;
  int64_t start_, stop_;
};

class Replace final : public Decoder {
 public:
  Replace(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::vector<std::string> Decode(std::vector<std::string> tokens) const override {
    for (std::string& t : tokens) t = pattern_->ReplaceAll(t, content_);
    return tokens;
  }
  std::string RawToken(std::string token) const override {
    return pattern_->ReplaceAll(token, content_);
  }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

class Sequence final : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  std::vector<std::string> Decode(std::vector<std::string> tokens) const override {
    for (const auto& p : parts_) tokens = p->Decode(std::move(tokens));
    return tokens;
  }
  std::string RawToken(std::string token) const override {
    for (const auto& p : parts_) token = p->RawToken(std::move(token));
    return token;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const json& j) {
  if (j.is_null()) return nullptr;
  ASSIGN_OR_RETURN(std::string type, TypeOf(j, "decoder"));
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "Metaspace") {
    std::string replacement = "\xE2\x96\x81";
    if (j.contains("replacement")) {
      ASSIGN_OR_RETURN(replacement, GetString(j, "replacement", "Metaspace decoder"));
    }
    bool strip_first = true;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      strip_first = j["prepend_scheme"].get<std::string>() != "never";
    } else {
      ASSIGN_OR_RETURN(strip_first, GetBool(j, "add_prefix_space", true, "Metaspace decoder"));
    }
    return std::make_unique<Metaspace>(std::move(replacement), strip_first);
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip") {
    ASSIGN_OR_RETURN(std::string content, GetString(j, "content", "Strip decoder"));
    ASSIGN_OR_RETURN(int64_t start, GetInt(j, "start", 0, "Strip decoder"));
    ASSIGN_OR_RETURN(int64_t stop, GetInt(j, "stop", 0, "Strip decoder"));
    if (content.empty() || start < 0 || stop < 0) {
      return absl::InvalidArgumentError(
          "Strip decoder: content must be non-empty and start/stop >= 0");
    }
    return std::make_unique<Strip>(std::move(content), start, stop);
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(auto pattern, ParsePattern(j, "Replace decoder"));
    ASSIGN_OR_RETURN(std::string content, GetString(j, "content", "Replace decoder"));
    return std::make_unique<Replace>(std::move(pattern), std::move(content));
  }
  if (type == "Sequence") {
    if (!j.contains("decoders") || !j["decoders"].is_array()) {
      return absl::InvalidArgumentError("Sequence decoder without a \"decoders\" list");
    }
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const json& part : j["decoders"]) {
      ASSIGN_OR_RETURN(auto d, ParseDecoder(part));
      if (d) parts.push_back(std::move(d));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported decoder type '", type, "'"));
}

}  // namespace tandem::tokenizer_internal
