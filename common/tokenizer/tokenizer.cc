#include "common/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/added_vocabulary.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/post_processor.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace tandem {

using nlohmann::json;
using namespace tokenizer_internal;  // NOLINT: the pipeline's parts

namespace {

constexpr uintmax_t kMaxTokenizerBytes = 512ull << 20;

absl::Status InFile(const absl::Status& s, const std::string& source) {
  return absl::Status(s.code(), absl::StrCat(source, ": ", s.message()));
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (std::filesystem::is_directory(path, ec))
    file = (std::filesystem::path(path) / "tokenizer.json").string();
  const uintmax_t size = std::filesystem::file_size(file, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(file, ": cannot open (", ec.message(), ")"));
  if (size > kMaxTokenizerBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": ", size, " bytes is too large for a tokenizer.json"));
  }
  std::ifstream in(file, std::ios::binary);
  std::string text(size, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(size))) {
    return absl::DataLossError(absl::StrCat(file, ": read failed"));
  }
  return FromJson(text, file);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json_text,
                                                               const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON: ", e.what()));
  }
  if (!j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  auto field = [&](const char* key) -> const json& {
    static const json kNull;
    auto it = j.find(key);
    return it == j.end() ? kNull : *it;
  };
  auto parsed = [&](auto status_or, auto* out) -> absl::Status {
    if (!status_or.ok()) return InFile(status_or.status(), source);
    *out = std::move(status_or).value();
    return absl::OkStatus();
  };
  if (!field("truncation").is_null() || !field("padding").is_null()) {
    // Truncation and padding apply to batch encoding for training; Tandem never truncates a prompt
    // silently, so they are ignored rather than refused.
  }
  if (!j.contains("model"))
    return absl::InvalidArgumentError(absl::StrCat(source, ": no \"model\""));
  RETURN_IF_ERROR(parsed(BpeModel::Parse(field("model")), &t->model_));
  RETURN_IF_ERROR(parsed(AddedVocabulary::Parse(field("added_tokens")), &t->added_));
  RETURN_IF_ERROR(parsed(ParseNormalizer(field("normalizer")), &t->normalizer_));
  RETURN_IF_ERROR(parsed(ParsePreTokenizer(field("pre_tokenizer")), &t->pre_tokenizer_));
  RETURN_IF_ERROR(parsed(ParsePostProcessor(field("post_processor")), &t->post_processor_));
  RETURN_IF_ERROR(parsed(ParseDecoder(field("decoder")), &t->decoder_));
  int64_t max_id = t->model_->max_id();
  for (const AddedToken& a : t->added_->tokens()) max_id = std::max<int64_t>(max_id, a.id);
  t->vocab_size_ = max_id + 1;
  return t;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!unicode::IsValidUtf8(text)) {
    repaired = unicode::ToValidUtf8(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  std::vector<Piece> pieces;
  auto run_pipeline = [&](std::string normalized, bool at_start) {
    pieces.clear();
    pieces.push_back({std::move(normalized), at_start});
    if (pre_tokenizer_) pre_tokenizer_->Apply(&pieces);
    for (const Piece& p : pieces) model_->Tokenize(p.text, &ids);
  };
  for (TextSegment& seg : added_->Split(text, /*normalized_pass=*/false)) {
    if (seg.token_id >= 0) {
      ids.push_back(seg.token_id);
      continue;
    }
    std::string normalized =
        normalizer_ ? normalizer_->Normalize(std::move(seg.text)) : std::move(seg.text);
    if (!added_->has_normalized()) {
      run_pipeline(std::move(normalized), seg.offset == 0);
      continue;
    }
    for (TextSegment& sub : added_->Split(normalized, /*normalized_pass=*/true)) {
      if (sub.token_id >= 0) {
        ids.push_back(sub.token_id);
      } else {
        run_pipeline(std::move(sub.text), seg.offset == 0 && sub.offset == 0);
      }
    }
  }
  if (add_special_tokens && post_processor_) ids = post_processor_->Process(std::move(ids));
  return ids;
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const AddedToken* a = added_->Find(id)) {
      if (!(skip_special_tokens && a->special)) tokens.push_back(a->content);
      continue;
    }
    const std::string* s = model_->IdToToken(id);
    if (s == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is not in the vocabulary (size ", vocab_size_, ")"));
    }
    tokens.push_back(*s);
  }
  std::string out;
  if (decoder_) {
    for (const std::string& piece : decoder_->Decode(std::move(tokens))) out += piece;
  } else {
    // Without a decoder the reference joins tokens with spaces.
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out += tokens[i];
    }
  }
  return unicode::IsValidUtf8(out) ? out : unicode::ToValidUtf8(out);
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (const AddedToken* a = added_->FindByContent(token)) return a->id;
  auto it = model_->vocab().find(absl::string_view(token.data(), token.size()));
  if (it == model_->vocab().end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::IdToToken(int32_t id) const {
  if (const AddedToken* a = added_->Find(id)) return a->content;
  const std::string* s = model_->IdToToken(id);
  return s ? *s : std::string();
}

bool Tokenizer::IsSpecial(int32_t id) const {
  const AddedToken* a = added_->Find(id);
  return a != nullptr && a->special;
}

std::optional<std::string> Tokenizer::TokenBytes(int32_t id) const {
  if (const AddedToken* a = added_->Find(id)) {
    if (a->special) return std::nullopt;
    return a->content;
  }
  const std::string* s = model_->IdToToken(id);
  if (s == nullptr) return std::nullopt;
  return decoder_ ? decoder_->RawToken(*s) : *s;
}

bool Tokenizer::IsValidId(int32_t id) const {
  return added_->Find(id) != nullptr || model_->IdToToken(id) != nullptr;
}

}  // namespace tandem
