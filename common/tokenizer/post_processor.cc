#include "common/tokenizer/post_processor.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/json_util.h"

namespace tandem::tokenizer_internal {
namespace {

using nlohmann::json;

// A template: a list of items, each either the sequence or a run of special-token ids.
class Template final : public PostProcessor {
 public:
  struct Item {
    bool is_sequence = false;
    std::vector<int32_t> ids;
  };
  explicit Template(std::vector<Item> items) : items_(std::move(items)) {}
  std::vector<int32_t> Process(std::vector<int32_t> ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const Item& item : items_) {
      if (item.is_sequence) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.insert(out.end(), item.ids.begin(), item.ids.end());
      }
    }
    return out;
  }

 private:
  std::vector<Item> items_;
};

class Identity final : public PostProcessor {
 public:
  std::vector<int32_t> Process(std::vector<int32_t> ids) const override { return ids; }
};

class Sequence final : public PostProcessor {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
  std::vector<int32_t> Process(std::vector<int32_t> ids) const override {
    for (const auto& p : parts_) ids = p->Process(std::move(ids));
    return ids;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

absl::StatusOr<std::unique_ptr<PostProcessor>> ParseTemplate(const json& j) {
  if (!j.contains("single") || !j["single"].is_array()) {
    return absl::InvalidArgumentError("TemplateProcessing: \"single\" must be a list");
  }
  const json specials = j.contains("special_tokens") && j["special_tokens"].is_object()
                            ? j["special_tokens"]
                            : json::object();
  std::vector<Template::Item> items;
  for (const json& piece : j["single"]) {
    Template::Item item;
    if (piece.is_object() && piece.contains("Sequence")) {
      item.is_sequence = true;
    } else if (piece.is_object() && piece.contains("SpecialToken") &&
               piece["SpecialToken"].is_object() && piece["SpecialToken"].contains("id") &&
               piece["SpecialToken"]["id"].is_string()) {
      const std::string name = piece["SpecialToken"]["id"].get<std::string>();
      if (!specials.contains(name) || !specials[name].contains("ids") ||
          !specials[name]["ids"].is_array()) {
        return absl::InvalidArgumentError(absl::StrCat("TemplateProcessing: special token \"", name,
                                                       "\" is not in special_tokens"));
      }
      for (const json& id : specials[name]["ids"]) {
        if (!id.is_number_integer()) {
          return absl::InvalidArgumentError(
              absl::StrCat("TemplateProcessing: ids of \"", name, "\" must be integers"));
        }
        item.ids.push_back(id.get<int32_t>());
      }
    } else {
      return absl::InvalidArgumentError(
          "TemplateProcessing: items must be {\"Sequence\"} or {\"SpecialToken\"}");
    }
    items.push_back(std::move(item));
  }
  return std::make_unique<Template>(std::move(items));
}

// BertProcessing / RobertaProcessing: {"cls": [token, id], "sep": [token, id]}.
absl::StatusOr<std::unique_ptr<PostProcessor>> ParseClsSep(const json& j, const char* what) {
  auto id_of = [&](const char* key) -> absl::StatusOr<int32_t> {
    if (!j.contains(key) || !j[key].is_array() || j[key].size() != 2 ||
        !j[key][1].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": \"", key, "\" must be [token, id]"));
    }
    return j[key][1].get<int32_t>();
  };
  ASSIGN_OR_RETURN(int32_t cls, id_of("cls"));
  ASSIGN_OR_RETURN(int32_t sep, id_of("sep"));
  std::vector<Template::Item> items(3);
  items[0].ids = {cls};
  items[1].is_sequence = true;
  items[2].ids = {sep};
  return std::make_unique<Template>(std::move(items));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const json& j) {
  if (j.is_null()) return nullptr;
  ASSIGN_OR_RETURN(std::string type, TypeOf(j, "post_processor"));
  if (type == "TemplateProcessing") return ParseTemplate(j);
  if (type == "ByteLevel") return std::make_unique<Identity>();
  if (type == "BertProcessing") return ParseClsSep(j, "BertProcessing");
  if (type == "RobertaProcessing") return ParseClsSep(j, "RobertaProcessing");
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array()) {
      return absl::InvalidArgumentError("Sequence post_processor without a \"processors\" list");
    }
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (const json& part : j["processors"]) {
      ASSIGN_OR_RETURN(auto p, ParsePostProcessor(part));
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported post_processor type '", type, "'"));
}

}  // namespace tandem::tokenizer_internal
