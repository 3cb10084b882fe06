#include "common/rpc/tls.h"

#include <algorithm>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/file.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain of this process: its gRPC servers listen with TLS, and its "
          "clients present it to servers that ask (mutual TLS); needs --tls-key-file");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls-cert-file");
ABSL_FLAG(std::string, tls_ca_file, "",
          "PEM CA certificates: clients verify servers against them, and servers verify client "
          "certificates (workers require one; the router requires one to register a worker)");
ABSL_FLAG(std::string, tls_server_name, "",
          "name servers' certificates are checked against, instead of the host of the address "
          "dialled (e.g. when workers are dialled by IP)");
ABSL_FLAG(int32_t, tls_refresh_s, 10,
          "seconds between re-reads of the TLS files (renewed certificates are picked up)");

namespace tandem::rpc {
namespace {

absl::Status CheckPem(const std::string& flag, const std::string& path, const char* what) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok())
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": cannot read ", path));
  if (!absl::StrContains(*text, "-----BEGIN ") || !absl::StrContains(*text, what)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", path, " holds no PEM ", what, " block"));
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> Provider(const TlsOptions& o,
                                                                             bool identity,
                                                                             bool roots) {
  const unsigned refresh = static_cast<unsigned>(std::max(1, o.refresh_s));
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      identity ? o.key_file : "", identity ? o.cert_file : "", roots ? o.ca_file : "", refresh);
}

}  // namespace

absl::Status ValidateTlsOptions(const TlsOptions& o) {
  if (o.cert_file.empty() != o.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert-file and --tls-key-file go together (a certificate and its private key)");
  }
  if (!o.cert_file.empty()) {
    if (absl::Status s = CheckPem("tls-cert-file", o.cert_file, "CERTIFICATE"); !s.ok()) return s;
    if (absl::Status s = CheckPem("tls-key-file", o.key_file, "PRIVATE KEY"); !s.ok()) return s;
  }
  if (!o.ca_file.empty()) {
    if (absl::Status s = CheckPem("tls-ca-file", o.ca_file, "CERTIFICATE"); !s.ok()) return s;
  }
  if (o.refresh_s < 1) return absl::InvalidArgumentError("--tls-refresh-s must be at least 1");
  return absl::OkStatus();
}

absl::StatusOr<TlsOptions> TlsOptionsFromFlags() {
  TlsOptions o;
  o.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  o.key_file = absl::GetFlag(FLAGS_tls_key_file);
  o.ca_file = absl::GetFlag(FLAGS_tls_ca_file);
  o.server_name = absl::GetFlag(FLAGS_tls_server_name);
  o.refresh_s = absl::GetFlag(FLAGS_tls_refresh_s);
  if (absl::Status s = ValidateTlsOptions(o); !s.ok()) return s;
  return o;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsOptions& o,
                                                           ClientAuth client_auth) {
  if (!o.server_tls()) return grpc::InsecureServerCredentials();
  const bool verify_clients = !o.ca_file.empty() && client_auth != ClientAuth::kNone;
  grpc::experimental::TlsServerCredentialsOptions options(
      Provider(o, /*identity=*/true, /*roots=*/verify_clients));
  options.watch_identity_key_cert_pairs();
  if (verify_clients) {
    options.watch_root_certs();
    options.set_cert_request_type(client_auth == ClientAuth::kRequired
                                      ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                      : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsOptions& o) {
  if (!o.client_tls()) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  const bool identity = !o.cert_file.empty(), roots = !o.ca_file.empty();
  options.set_certificate_provider(Provider(o, identity, roots));
  if (identity) options.watch_identity_key_cert_pairs();
  if (roots) options.watch_root_certs();  // else the system's roots
  return grpc::experimental::TlsCredentials(options);
}

std::shared_ptr<grpc::Channel> CreateTlsChannel(const std::string& target, const TlsOptions& o,
                                                grpc::ChannelArguments args) {
  if (o.client_tls() && !o.server_name.empty()) args.SetSslTargetNameOverride(o.server_name);
  return grpc::CreateCustomChannel(target, ChannelCredentials(o), args);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> ChannelFromFlags(const std::string& target) {
  absl::StatusOr<TlsOptions> o = TlsOptionsFromFlags();
  if (!o.ok()) return o.status();
  return CreateTlsChannel(target, *o);
}

std::vector<std::string> TlsFlagArguments(const TlsOptions& o) {
  std::vector<std::string> args;
  if (!o.cert_file.empty()) args.push_back("--tls-cert-file=" + o.cert_file);
  if (!o.key_file.empty()) args.push_back("--tls-key-file=" + o.key_file);
  if (!o.ca_file.empty()) args.push_back("--tls-ca-file=" + o.ca_file);
  if (!o.server_name.empty()) args.push_back("--tls-server-name=" + o.server_name);
  args.push_back(absl::StrCat("--tls-refresh-s=", o.refresh_s));
  return args;
}

bool PeerAuthenticated(const grpc::ServerContextBase& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  return auth != nullptr && auth->IsPeerAuthenticated();
}

}  // namespace tandem::rpc
