#include "common/serving/speculation_convert.h"

namespace tandem {

void SpeculationFromProto(const v1::Speculation& s, EngineRequest* request) {
  switch (s.method()) {
    case v1::SPECULATION_METHOD_OFF: request->speculation = SpeculationMethod::kOff; break;
    case v1::SPECULATION_METHOD_NGRAM: request->speculation = SpeculationMethod::kNgram; break;
    case v1::SPECULATION_METHOD_DRAFT: request->speculation = SpeculationMethod::kDraft; break;
    default: request->speculation.reset(); break;
  }
  request->num_speculative_tokens = s.num_tokens();
}

v1::Speculation SpeculationToProto(SpeculationMethod method, int32_t num_tokens) {
  v1::Speculation s;
  switch (method) {
    case SpeculationMethod::kOff: s.set_method(v1::SPECULATION_METHOD_OFF); break;
    case SpeculationMethod::kNgram: s.set_method(v1::SPECULATION_METHOD_NGRAM); break;
    case SpeculationMethod::kDraft: s.set_method(v1::SPECULATION_METHOD_DRAFT); break;
  }
  s.set_num_tokens(num_tokens);
  return s;
}

v1::SpeculationCounts ToProto(const SpeculationCounts& counts) {
  v1::SpeculationCounts c;
  c.set_proposed(counts.proposed);
  c.set_accepted(counts.accepted);
  return c;
}

}  // namespace tandem
