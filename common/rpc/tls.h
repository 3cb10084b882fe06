// Transport security for every gRPC hop: TLS from PEM files, mutual TLS where the server asks for
// client certificates, and certificates re-read from disk while the process runs (gRPC's file
// watcher: a renewed certificate is used by new connections within `refresh` of being written).
//
// One set of flags per process (--tls-cert-file, --tls-key-file, --tls-ca-file, --tls-server-name,
// --tls-refresh-s; TlsOptionsFromFlags): a process's certificate is what its servers present and
// what its clients present to servers that ask (mutual TLS); the CA file verifies peers both ways.
// No flags: plaintext, as before.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace tandem::rpc {

struct TlsOptions {
  std::string cert_file;    // PEM certificate chain of this process (with key_file)
  std::string key_file;     // PEM private key
  std::string ca_file;      // PEM CA certificates that peers' certificates must chain to
  std::string server_name;  // clients: the name servers' certificates are checked against
                            // instead of the host in the target address ("" = that host)
  int refresh_s = 10;       // how often the files are re-read

  // Whether servers listen with TLS (a certificate is given).
  bool server_tls() const { return !cert_file.empty(); }
  // Whether clients dial with TLS (a CA or a certificate is given).
  bool client_tls() const { return !ca_file.empty() || !cert_file.empty(); }
};

// What a server asks of its clients.
enum class ClientAuth {
  kNone,      // no client certificates (one-way TLS)
  kOptional,  // a client may present one; if it does it must chain to the CA (mutual TLS for
              // those that do: check PeerAuthenticated per call)
  kRequired,  // every connection presents a certificate that chains to the CA
};

// The flags' values. INVALID_ARGUMENT when they do not make a whole (a certificate without its key,
// an unreadable or non-PEM file).
absl::StatusOr<TlsOptions> TlsOptionsFromFlags();
absl::Status ValidateTlsOptions(const TlsOptions& options);

// Credentials for a listener: insecure without a certificate. Client certificates are only asked
// for when a CA file is given (kOptional/kRequired then apply; without a CA they mean kNone).
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsOptions& options,
                                                           ClientAuth client_auth);
// Credentials for a channel: insecure unless options.client_tls(). Servers are verified against
// the CA file (the system's roots without one); this process's certificate is presented when the
// server asks.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsOptions& options);
// A channel to `target` with the options' credentials, and `args` with the server name override.
std::shared_ptr<grpc::Channel> CreateTlsChannel(const std::string& target,
                                                const TlsOptions& options,
                                                grpc::ChannelArguments args = {});

// A channel to `target` set up by this process's --tls-* flags (what the CLI's clients use).
absl::StatusOr<std::shared_ptr<grpc::Channel>> ChannelFromFlags(const std::string& target);
// The --tls-* flags that give another process the same options (tandem up's children).
std::vector<std::string> TlsFlagArguments(const TlsOptions& options);

// Whether the call's peer presented a certificate that was verified (mutual TLS).
bool PeerAuthenticated(const grpc::ServerContextBase& context);

}  // namespace tandem::rpc
