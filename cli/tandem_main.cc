// `tandem SUBCOMMAND [--flags]`: the command-line entry point. Flags are Abseil flags; both
// --max-tokens and --max_tokens spellings are accepted.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/usage.h"
#include "cli/commands.h"
#include "common/backend/cpu/openblas_setup.h"
#include "common/base/command_line.h"

namespace {

constexpr char kUsage[] = R"(tandem — LLM inference server tools

Usage: tandem COMMAND [--flags]

Commands:
  make-model   Write a random-initialised model as a Hugging Face directory.
               --preset P --out DIR [--seed N] [--dtype bf16|f16|f32] [--tokenizer FILE]
               [--shard-size-mb N]
               --list-presets prints the presets.
               --pad-from DIR --out DIR [--intermediate-size N] [--extra-layers L]: the model
               padded into a larger one computing the same function (zero-output neurons and
               layers), a memory-bound benchmark target with the small model's predictions.
  up           Start a cluster on this machine: a router and prefill and decode workers.
               [--model DIR] [--prefill N] [--decode M] [--combined K] [--port 50051]
               [--log-dir DIR] [--ready-file F] [--worker-args=--flag,...] [engine flags]
               [--prefill-worker-args=--flag,...] [--decode-worker-args=--flag,...]
               [--kv-transport cuda-ipc,nccl,tcp] (an ordered list; default tcp, cuda-ipc,tcp on a GPU)
               Waits until every worker serves, prints the endpoints; Ctrl-C drains and stops.
               Without --model: $TANDEM_DEFAULT_MODEL, else the embedded models/kjv-target, else a
               random tiny Llama (models-cache/tiny-llama, written on first use).
  bench        Load-test a router: --server HOST:PORT (--concurrency N | --request-rate R
               [--burstiness B] | --sweep-concurrency 1,4,16) [--num-requests N | --duration-s T]
               [--workload random|shared-prefix|multi-turn|jsonl] [--input-len N] [--output-len N]
               [--slo-ttft-ms T] [--slo-tpot-ms T] [--json-out F] [--chart F.svg] [--api-key KEY]
               [--frontend http --http-server HOST:PORT]: through the OpenAI HTTP API; without
               --server, any OpenAI-compatible server (llama-server) with --vocab-size N
  generate     Generate in-process from a Hugging Face model directory, or from a router.
               --model DIR (--prompt TEXT | --token-ids 1,2,3) [--max-tokens N]
               [--temperature T] [--top-p P] [--top-k K] [--min-p P] [--seed S]
               [--repetition-penalty R] [--presence-penalty P] [--frequency-penalty F]
               [--logit-bias ID:BIAS,...] [--stop-token-ids 1,2] [--stop S1,S2] [--min-tokens N] [--ignore-eos]
               [--prompt-logprobs K] [--logprobs K] [--prefill-chunk N] [--block-size N] [--json]
               [--batch-file F.jsonl] [--device cpu|cuda] [--kv-cache-dtype auto|f32|bf16|f16|int8|fp8]
               [--speculative-method off|ngram|draft] [--speculative-model DIR]
               [--num-speculative-tokens K] [--ngram-min N --ngram-max M]
               [--speculative-adaptive=true|false] [--quantization none|int8|int4]
               [--quantize-lm-head] [engine flags]
               --server HOST:PORT streams from a Tandem router instead (no --model needed), with
               [--timeout-s T] [--priority P] [--api-key KEY] besides the flags above.
  eval         A model's quality on a text: perplexity, and against a reference (default: the
               same model unquantized, default KV cache) top-1 agreement and mean KL per token.
               --model DIR (--text-file F | --windows-file F.json) [--quantization none|int8|int4]
               [--quantize-lm-head] [--kv-cache-dtype ...] [--activation-dtype f32|bf16|int8]
               [--reference-model DIR] [--context N] [--max-eval-tokens N] [--json]
               [--progress=false] [--device cpu|cuda]
  plan         Capacity from the checkpoint's headers, loading no weight: weight bytes (quantized
               or not), KV bytes per token, an activation reserve, sequences that fit.
               --model DIR --memory BYTES [--quantization none|int8|int4] [--quantize-lm-head]
               [--kv-cache-dtype auto|f32|bf16|f16|int8|fp8] [--max-model-len N] [--max-num-seqs N]
               [--max-num-batched-tokens N] [--block-size N] [--device cpu|cuda] [--json]
  quantize     Writes a quantized checkpoint (GPTQ or compressed-tensors format) that Tandem and
               other engines load: round to nearest, or GPTQ over calibration text.
               --model DIR --out DIR [--bits 4|8] [--group-size N|-1] [--method gptq|rtn]
               [--format gptq|compressed-tensors] [--sym=true|false] [--act-order]
               [--calibration-file F | --calibration-windows-file F.json] [--calibration-tokens N]
               [--calibration-memory BYTES]
               [--context N] [--damp F] [--shard-size-mb N] [--json] [--progress=false]
  tokenize     Encode text with the model's tokenizer.json; prints the ids.
               --model PATH (--text T | --file F | --jsonl F) [--add-special-tokens] [--json]
               PATH is a model directory or a tokenizer.json file. --jsonl F: one JSON string per
               line in, one {"ids": [...]} per line out.
  detokenize   Decode token ids with the model's tokenizer.json; prints the text.
               --model PATH (--ids 1,2,3 | --jsonl F) [--skip-special-tokens] [--json]
               --jsonl F: one JSON array of ids per line in, one {"text": ..., "stream": ...} per
               line out ("stream" is the same ids detokenized incrementally, one at a time).
  chat-template  Render the model's chat template (tokenizer_config.json's chat_template, or
               chat_template.jinja) over a conversation, exactly as transformers does; prints the
               prompt with no newline added.
               --model DIR --messages-file F.json [--tools-file F.json] [--add-generation-prompt]
               [--kwargs JSON] [--template-name NAME]
  health       Asks a process its grpc.health.v1 status, as Kubernetes' gRPC probes do; prints it,
               exit 0 when SERVING.
               --server HOST:PORT [--service NAME] [--health-timeout-s S]
               NAME: "" (default: ready to take work), "liveness" (alive, draining included)
  help         This text. `tandem COMMAND --helpfull` lists every flag with its default.

TLS (up, bench, generate --server, health; and tandem-router and the workers themselves):
  [--tls-ca-file CA.pem] verifies the server; [--tls-cert-file C.pem --tls-key-file K.pem] is this
  process's certificate (mutual TLS); [--tls-server-name NAME] the name servers' certificates are
  checked against; [--tls-refresh-s 10] how often the files are re-read. `up` passes them on to the
  router and workers it starts. See docs/security.md.
)";

}  // namespace

int main(int argc, char** argv) {
  tandem::MaybeReexecWithFasterOpenBlasCore(argv);
  absl::SetProgramUsageMessage(kUsage);
  if (argc < 2 || std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0 ||
      std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  std::string program = std::string(argv[0]) + " " + command;
  std::vector<char*> sub_argv(argv + 1, argv + argc);
  sub_argv[0] = program.data();
  const std::vector<std::string> positional =
      tandem::ParseCommandLine(static_cast<int>(sub_argv.size()), sub_argv.data());
  if (positional.size() > 1) {
    std::fprintf(stderr, "tandem %s: unexpected argument '%s'\n", command.c_str(),
                 positional[1].c_str());
    return 2;
  }
  if (command == "make-model") return tandem::cli::MakeModelCommand();
  if (command == "generate") return tandem::cli::GenerateCommand();
  if (command == "up") return tandem::cli::UpCommand();
  if (command == "bench") return tandem::cli::BenchCommand();
  if (command == "eval") return tandem::cli::EvalCommand();
  if (command == "plan") return tandem::cli::PlanCommand();
  if (command == "quantize") return tandem::cli::QuantizeCommand();
  if (command == "chat-template") return tandem::cli::ChatTemplateCommand();
  if (command == "health") return tandem::cli::HealthCommand();
  if (command == "tokenize") return tandem::cli::TokenizeCommand();
  if (command == "detokenize") return tandem::cli::DetokenizeCommand();
  std::fprintf(stderr, "tandem: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
