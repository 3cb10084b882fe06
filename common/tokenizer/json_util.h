// Typed accessors for tokenizer.json fields with clear errors (the file is hostile input).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/regex.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer_internal {

// The "type" string of a component object; `what` names the component ("normalizer").
inline absl::StatusOr<std::string> TypeOf(const nlohmann::json& j, const char* what) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be an object with a \"type\""));
  }
  return j["type"].get<std::string>();
}

inline absl::StatusOr<bool> GetBool(const nlohmann::json& j, const char* key, bool fallback,
                                    const char* what) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": \"", key, "\" must be true or false"));
  }
  return j[key].get<bool>();
}

inline absl::StatusOr<std::string> GetString(const nlohmann::json& j, const char* key,
                                             const char* what) {
  if (!j.contains(key) || !j[key].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": \"", key, "\" must be a string"));
  }
  return j[key].get<std::string>();
}

inline absl::StatusOr<int64_t> GetInt(const nlohmann::json& j, const char* key, int64_t fallback,
                                      const char* what) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": \"", key, "\" must be an integer"));
  }
  return j[key].get<int64_t>();
}

// {"pattern": {"String": "x"}} or {"pattern": {"Regex": "..."}} → a compiled regex.
inline absl::StatusOr<std::unique_ptr<Regex>> ParsePattern(const nlohmann::json& j,
                                                           const char* what) {
  if (!j.contains("pattern") || !j["pattern"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": missing \"pattern\" object"));
  }
  const nlohmann::json& p = j["pattern"];
  absl::StatusOr<std::unique_ptr<Regex>> r;
  if (p.contains("String") && p["String"].is_string()) {
    r = Regex::Literal(p["String"].get<std::string>());
  } else if (p.contains("Regex") && p["Regex"].is_string()) {
    r = Regex::Compile(p["Regex"].get<std::string>());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": pattern must be {\"String\"} or {\"Regex\"}"));
  }
  if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", r.status().message()));
  return r;
}

}  // namespace tandem::tokenizer_internal
