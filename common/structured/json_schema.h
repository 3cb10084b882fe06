// JSON Schema → Grammar: the JSON texts structured output may generate for a schema.
//
// What is generated (every text it allows is valid against the schema; docs/structured_output.md):
// - JSON as json.dumps writes it, compact or pretty: between tokens and around the value nothing,
//   one space, or a line break (LF or CR LF) and an indent of at most kMaxWhitespace spaces or
//   tabs; whitespace may lead the value but not follow it (the value's end is the output's end);
//   strings are valid UTF-8 with JSON's escapes.
// - type (one or several), enum, const, anyOf / oneOf (as anyOf), allOf of one schema, $ref to
//   "#", "#/$defs/..." or "#/definitions/..." (recursion allowed), properties / required /
//   additionalProperties, items / minItems / maxItems, minLength / maxLength.
// - An object's declared properties appear in the order declared, required ones always, optional
//   ones when the model chooses; keys not declared appear (after them) only when
//   additionalProperties is true or a schema. An object schema without properties takes any keys.
// - Annotations (title, description, default, examples, $schema, $id, $comment, deprecated, ...)
//   are ignored. Validation keywords the grammar cannot enforce (pattern, format, minimum, maximum,
//   multipleOf, uniqueItems, not, if/then/else, prefixItems, ...) are refused with
//   INVALID_ARGUMENT naming the keyword and where it is, rather than ignored.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "common/sampling/sampling_params.h"
#include "common/structured/grammar.h"
#include "nlohmann/json.hpp"

namespace tandem::structured {

inline constexpr int kMaxWhitespace = 32;
inline constexpr size_t kMaxSchemaBytes = StructuredOutput::kMaxSchemaBytes;

absl::StatusOr<Grammar> JsonSchemaGrammar(const nlohmann::ordered_json& schema);
// The schema as JSON text (at most kMaxSchemaBytes).
absl::StatusOr<Grammar> JsonSchemaGrammarFromText(std::string_view schema_text);
// Any JSON object (OpenAI's response_format {"type": "json_object"}).
Grammar AnyJsonObjectGrammar();

}  // namespace tandem::structured
