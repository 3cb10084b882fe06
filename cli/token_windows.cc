#include "cli/token_windows.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace tandem::cli {
namespace {

// {"windows": [[id, ...], ...]}.
absl::StatusOr<std::vector<std::vector<int32_t>>> ParseWindows(const std::string& path,
                                                               const std::string& content) {
  const nlohmann::json j = nlohmann::json::parse(content, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("windows") || !j["windows"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not JSON of the form {\"windows\": [[id, ...], ...]}"));
  }
  std::vector<std::vector<int32_t>> windows;
  for (const auto& w : j["windows"]) {
    if (!w.is_array())
      return absl::InvalidArgumentError(absl::StrCat(path, ": a window is not a list"));
    std::vector<int32_t> ids;
    for (const auto& id : w) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": window ", windows.size(),
                                                       " holds a value that is not a token id"));
      }
      ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    windows.push_back(std::move(ids));
  }
  return windows;
}

}  // namespace

absl::StatusOr<TokenWindows> LoadTokenWindows(const std::string& model_dir,
                                              const std::string& text_file,
                                              const std::string& windows_file, int64_t context,
                                              int64_t vocab, int64_t max_predicted) {
  const std::string input = text_file.empty() ? windows_file : text_file;
  std::ifstream in(input, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(input, ": cannot open"));
  std::ostringstream content;
  content << in.rdbuf();
  TokenWindows out;
  std::vector<std::vector<int32_t>>& windows = out.windows;
  if (!text_file.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Load(model_dir));
    const std::vector<int32_t> tokens =
        tokenizer->Encode(content.str(), /*add_special_tokens=*/true);
    // Windows of `context` tokens overlapping by one: every token after the first predicted once.
    for (int64_t start = 0; start + 1 < static_cast<int64_t>(tokens.size());) {
      const int64_t end = std::min<int64_t>(static_cast<int64_t>(tokens.size()), start + context);
      windows.emplace_back(tokens.begin() + start, tokens.begin() + end);
      start = end - 1;
    }
  } else {
    ASSIGN_OR_RETURN(windows, ParseWindows(windows_file, content.str()));
  }
  // The cap, and the checks on every window against this model.
  int64_t& total = out.predicted;
  for (size_t w = 0; w < windows.size(); ++w) {
    if (max_predicted > 0 && total + static_cast<int64_t>(windows[w].size()) - 1 > max_predicted) {
      windows[w].resize(static_cast<size_t>(std::max<int64_t>(0, max_predicted - total) + 1));
    }
    if (static_cast<int64_t>(windows[w].size()) > context) {
      return absl::InvalidArgumentError(absl::StrCat(input, ": window ", w, " has ",
                                                     windows[w].size(),
                                                     " tokens, more than --context ", context));
    }
    for (int32_t id : windows[w]) {
      if (id < 0 || id >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat(input, ": window ", w, " has token id ", id,
                                                       ", outside the vocabulary of ", vocab));
      }
    }
    total += std::max<int64_t>(0, static_cast<int64_t>(windows[w].size()) - 1);
    if (max_predicted > 0 && total >= max_predicted) {
      windows.resize(w + 1);
      break;
    }
  }
  if (total < 1) {
    return absl::InvalidArgumentError(absl::StrCat(input, ": nothing to run (under 2 tokens)"));
  }
  return out;
}

absl::StatusOr<int64_t> WindowContext(const LlamaModel& model, int64_t requested) {
  const int64_t max_pos = model.config().max_position_embeddings;
  const int64_t context = requested == 0 ? std::min<int64_t>(1024, max_pos) : requested;
  if (context < 2 || context > max_pos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--context ", context, ": must be in [2, ", max_pos, "]"));
  }
  return context;
}

absl::StatusOr<std::unique_ptr<WindowRunner>> WindowRunner::Create(
    std::unique_ptr<LlamaModel> model, std::optional<DType> kv_dtype, int64_t context) {
  auto s = std::unique_ptr<WindowRunner>(new WindowRunner());
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (context + kBlock - 1) / kBlock;
  ASSIGN_OR_RETURN(s->kv_, KvCacheStorage::Create(
                               model->backend(),
                               model->KvGeometry(blocks, kBlock, model->KvCacheDType(kv_dtype))));
  s->table_.resize(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) s->table_[i] = static_cast<int32_t>(i);
  s->model_ = std::move(model);
  return s;
}

absl::Status WindowRunner::Chunk(const std::vector<int32_t>& window, int64_t begin, int64_t n,
                                 std::vector<float>* logits) {
  ForwardInput in;
  in.token_ids.assign(window.begin() + begin, window.begin() + begin + n);
  in.seqs.push_back({n, begin, table_});
  if (logits != nullptr) {
    for (int64_t i = 0; i < n; ++i) in.logits_rows.push_back(static_cast<int32_t>(i));
  }
  return model_->runner().Forward(in, kv_.get(), logits != nullptr ? logits : &discard_);
}

ProgressBar::ProgressBar(const char* label, const char* unit, int64_t total, bool enabled)
    : label_(label),
      unit_(unit),
      total_(total),
      enabled_(enabled),
      start_(std::chrono::steady_clock::now()) {}

void ProgressBar::Update(int64_t done) {
  if (!enabled_) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (done < total_ && seconds - last_draw_ < 0.2) return;
  last_draw_ = seconds;
  constexpr int kWidth = 30;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
  std::fprintf(stderr, "\r%s [%s%s] %3d%% %lld/%lld %s, %.0f %s/s ", label_,
               std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
               total_ > 0 ? static_cast<int>(100 * done / total_) : 100,
               static_cast<long long>(done), static_cast<long long>(total_), unit_,
               seconds > 0 ? done / seconds : 0.0, unit_);
  std::fflush(stderr);
}

void ProgressBar::Finish() {
  if (enabled_ && last_draw_ >= 0) std::fputc('\n', stderr);
  last_draw_ = -1;
}

}  // namespace tandem::cli
