#include "common/tokenizer/byte_fallback_tokenizer.h"

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/byte_level.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using nlohmann::json;

}  // namespace

absl::StatusOr<std::unique_ptr<ByteFallbackTokenizer>> ByteFallbackTokenizer::Load(
    const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON: ", e.what()));
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object() ||
      !j["model"].contains("vocab") || !j["model"]["vocab"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no model.vocab object"));
  }
  std::unique_ptr<ByteFallbackTokenizer> t(new ByteFallbackTokenizer());
  std::unordered_map<std::string, int32_t> vocab;
  for (const auto& [tok, id] : j["model"]["vocab"].items()) {
    if (!id.is_number_integer()) continue;
    vocab[tok] = id.get<int32_t>();
  }
  // Reverse map from byte-level alphabet characters to bytes, to decode multi-byte tokens.
  const std::array<int, 256>& cps = ByteLevelCodePoints();
  std::unordered_map<int, uint8_t> cp_to_byte;
  for (int b = 0; b < 256; ++b) cp_to_byte[cps[b]] = static_cast<uint8_t>(b);
  bool byte_level = true;
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(EncodeUtf8(cps[b]));
    if (it == vocab.end()) {
      byte_level = false;
      break;
    }
    t->byte_to_id_[b] = it->second;
  }
  if (!byte_level) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = vocab.find(name);
      if (it == vocab.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": vocabulary has neither byte-level tokens nor <0xNN> byte-fallback tokens"));
      }
      t->byte_to_id_[b] = it->second;
    }
  }
  for (const auto& [tok, id] : vocab) {
    std::string bytes;
    if (byte_level) {
      // Decode UTF-8 code points of the token string back to bytes.
      for (size_t i = 0; i < tok.size();) {
        const auto c0 = static_cast<uint8_t>(tok[i]);
        int cp = c0, len = 1;
        if (c0 >= 0xE0 && i + 2 < tok.size()) {
          cp = ((c0 & 0x0F) << 12) | ((tok[i + 1] & 0x3F) << 6) | (tok[i + 2] & 0x3F);
          len = 3;
        } else if (c0 >= 0xC0 && i + 1 < tok.size()) {
          cp = ((c0 & 0x1F) << 6) | (tok[i + 1] & 0x3F);
          len = 2;
        }
        auto it = cp_to_byte.find(cp);
        if (it != cp_to_byte.end()) {
          bytes.push_back(static_cast<char>(it->second));
        } else {
          bytes.append(tok, i, len);
        }
        i += len;
      }
    } else {
      unsigned v = 0;
      if (tok.size() == 6 && std::sscanf(tok.c_str(), "<0x%02X>", &v) == 1) {
        bytes.push_back(static_cast<char>(v));
      } else {
        bytes = tok;  // SentencePiece pieces: "▁" (U+2581) stands for a space
        for (size_t pos; (pos = bytes.find("\xE2\x96\x81")) != std::string::npos;) {
          bytes.replace(pos, 3, " ");
        }
      }
    }
    t->id_to_bytes_[id] = std::move(bytes);
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string()) {
        continue;
      }
      const int32_t id = a["id"].get<int32_t>();
      t->id_to_bytes_[id] = a["content"].get<std::string>();
      t->special_[id] = a.value("special", false);
    }
  }
  return t;
}

std::vector<int32_t> ByteFallbackTokenizer::Encode(const std::string& text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(byte_to_id_[c]);
  return ids;
}

absl::StatusOr<std::string> ByteFallbackTokenizer::Decode(const std::vector<int32_t>& ids,
                                                         bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    auto it = id_to_bytes_.find(id);
    if (it == id_to_bytes_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is not in the vocabulary"));
    }
    if (skip_special) {
      auto sp = special_.find(id);
      if (sp != special_.end() && sp->second) continue;
    }
    out += it->second;
  }
  return out;
}

}  // namespace tandem
