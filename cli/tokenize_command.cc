// `tandem tokenize` and `tandem detokenize`: the tokenizer.json pipeline from the command line.
// The --jsonl modes load the tokenizer once for many inputs (conformance tests use them).
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "common/base/file.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(bool, json);
ABSL_FLAG(std::string, text, "", "tokenize: the text to encode");
ABSL_FLAG(std::string, file, "", "tokenize: encode the whole content of this file");
ABSL_FLAG(
    std::string, jsonl, "",
    "tokenize: file with one JSON string per line; detokenize: one JSON array of ids per line");
ABSL_FLAG(bool, add_special_tokens, false,
          "tokenize: apply the post-processor's template (e.g. add BOS)");
ABSL_FLAG(std::string, ids, "", "detokenize: comma-separated token ids");
ABSL_FLAG(bool, skip_special_tokens, false, "detokenize: leave special tokens out of the text");

namespace tandem::cli {
namespace {

using nlohmann::json;
// Output objects keep their keys in the documented order.
using ordered_json = nlohmann::ordered_json;

template <typename Json>
std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

int Fail(const char* command, const absl::Status& s) {
  std::fprintf(stderr, "tandem %s: %s\n", command, std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// Calls `handle(line_number, parsed)` for each non-blank line of a JSON-lines file.
template <typename Handle>
absl::Status ForEachJsonLine(const std::string& path, Handle handle) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json parsed = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": not valid JSON"));
    }
    RETURN_IF_ERROR(handle(number, parsed));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return absl::OkStatus();
}

// Exactly one of the flags in `given` must be set.
absl::Status RequireExactlyOne(std::initializer_list<std::pair<const char*, bool>> given) {
  int count = 0;
  std::vector<std::string> names;
  for (const auto& [name, set] : given) {
    count += set ? 1 : 0;
    names.push_back(name);
  }
  if (count == 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("give exactly one of ", absl::StrJoin(names, ", ")));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer() {
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) {
    return absl::InvalidArgumentError(
        "--model PATH (a model directory or tokenizer.json) is required");
  }
  return Tokenizer::Load(model);
}

absl::StatusOr<std::vector<int32_t>> IdsFromJson(const json& j, const std::string& where) {
  if (!j.is_array())
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected an array of ids"));
  std::vector<int32_t> ids;
  ids.reserve(j.size());
  for (const json& e : j) {
    if (!e.is_number_integer() || e.get<int64_t>() < INT32_MIN || e.get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", Dump(e), " is not a token id"));
    }
    ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
  }
  return ids;
}

// Text of `ids` streamed through an IncrementalDetokenizer one id at a time.
absl::StatusOr<std::string> StreamDecode(const Tokenizer& tokenizer, std::span<const int32_t> ids,
                                         bool skip_special_tokens) {
  IncrementalDetokenizer detokenizer(&tokenizer, skip_special_tokens);
  std::string text;
  for (int32_t id : ids) {
    ASSIGN_OR_RETURN(std::string delta, detokenizer.Add(id));
    text += delta;
  }
  ASSIGN_OR_RETURN(std::string rest, detokenizer.Finish());
  return text + rest;
}

absl::Status Tokenize() {
  const std::string text = absl::GetFlag(FLAGS_text);
  const std::string file = absl::GetFlag(FLAGS_file);
  const std::string jsonl = absl::GetFlag(FLAGS_jsonl);
  RETURN_IF_ERROR(RequireExactlyOne(
      {{"--text", !text.empty()}, {"--file", !file.empty()}, {"--jsonl", !jsonl.empty()}}));
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer());
  const bool add_special = absl::GetFlag(FLAGS_add_special_tokens);
  if (!jsonl.empty()) {
    return ForEachJsonLine(jsonl, [&](int64_t number, const json& line) -> absl::Status {
      if (!line.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(jsonl, ":", number, ": expected a JSON string"));
      }
      const std::string out =
          Dump(ordered_json{{"ids", tokenizer->Encode(line.get<std::string>(), add_special)}});
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::fputc('\n', stdout);
      return absl::OkStatus();
    });
  }
  std::string input = text;
  if (!file.empty()) {
    ASSIGN_OR_RETURN(input, ReadFileToString(file));
  }
  const std::vector<int32_t> ids = tokenizer->Encode(input, add_special);
  const std::string out =
      absl::GetFlag(FLAGS_json) ? Dump(ordered_json{{"ids", ids}}) : absl::StrJoin(ids, ",");
  std::puts(out.c_str());
  return absl::OkStatus();
}

absl::Status Detokenize() {
  const std::string ids_flag = absl::GetFlag(FLAGS_ids);
  const std::string jsonl = absl::GetFlag(FLAGS_jsonl);
  RETURN_IF_ERROR(RequireExactlyOne({{"--ids", !ids_flag.empty()}, {"--jsonl", !jsonl.empty()}}));
  std::vector<int32_t> ids;
  if (!ids_flag.empty()) {  // parsed before the (slower) load
    ASSIGN_OR_RETURN(ids, ParseIds("--ids", ids_flag));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer());
  const bool skip_special = absl::GetFlag(FLAGS_skip_special_tokens);
  if (!jsonl.empty()) {
    return ForEachJsonLine(jsonl, [&](int64_t number, const json& line) -> absl::Status {
      const std::string where = absl::StrCat(jsonl, ":", number);
      ASSIGN_OR_RETURN(std::vector<int32_t> line_ids, IdsFromJson(line, where));
      absl::StatusOr<std::string> text = tokenizer->Decode(line_ids, skip_special);
      if (!text.ok()) {
        return absl::Status(text.status().code(),
                            absl::StrCat(where, ": ", text.status().message()));
      }
      ASSIGN_OR_RETURN(std::string stream, StreamDecode(*tokenizer, line_ids, skip_special));
      const std::string out = Dump(ordered_json{{"text", *text}, {"stream", stream}});
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::fputc('\n', stdout);
      return absl::OkStatus();
    });
  }
  ASSIGN_OR_RETURN(std::string text, tokenizer->Decode(ids, skip_special));
  if (absl::GetFlag(FLAGS_json)) {
    std::puts(Dump(ordered_json{{"text", text}}).c_str());
  } else {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  }
  return absl::OkStatus();
}

}  // namespace

int TokenizeCommand() {
  absl::Status s = Tokenize();
  return s.ok() ? 0 : Fail("tokenize", s);
}

int DetokenizeCommand() {
  absl::Status s = Detokenize();
  return s.ok() ? 0 : Fail("detokenize", s);
}

}  // namespace tandem::cli
