#ifndef TRIDENT_COMMON_GRPC_TLS_H_
#define TRIDENT_COMMON_GRPC_TLS_H_

// TLS for every gRPC port and mTLS between the cluster's services.
//
// A service given a certificate and key serves TLS; given a CA as well, it
// verifies client certificates against it (required, optional or not asked
// for) and its own outbound channels to other services present its
// certificate and verify theirs against the CA. Files are PEM, laid out as a
// Kubernetes `kubernetes.io/tls` Secret (tls.crt, tls.key, ca.crt) and
// re-read every `refresh_interval`: a Secret mounted as a directory (the
// kubelet swaps it atomically) rotates without a restart. New material
// applies to new connections.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace trident {

enum class ClientAuth {
  kNone,      // No client certificate is asked for.
  kOptional,  // Asked for and verified when sent (the router's public port).
  kRequire,   // Required and verified (mTLS between services).
};

absl::StatusOr<ClientAuth> ParseClientAuth(absl::string_view text);
absl::string_view ClientAuthName(ClientAuth auth);

struct TlsFiles {
  // PEM certificate chain and private key of this service. Both or neither.
  std::string cert_file;
  std::string key_file;
  // PEM CA bundle that peers' certificates must chain to.
  std::string ca_file;
  ClientAuth client_auth = ClientAuth::kRequire;
  // Whether outbound channels check that the server's certificate names the
  // host dialled (DNS or IP SAN). Off: any certificate of the CA is trusted
  // (pods dialled by IP).
  bool verify_hostname = true;
  absl::Duration refresh_interval = absl::Seconds(60);

  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

// Checks the files now (readable PEM, the key matches the certificate, the
// certificate chains to the CA) so that a bad Secret fails the start with a
// clear error instead of every handshake later. INVALID_ARGUMENT naming the
// flag at fault.
absl::Status CheckTlsFiles(const TlsFiles& files);

// The server's credentials: TLS with `files` (a certificate and key are
// required), client certificates as `files.client_auth` says.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsServerCredentials(
    const TlsFiles& files);

// A client's credentials: TLS verifying the server against `files.ca_file`
// (the system's roots when empty), presenting `files`' certificate when set.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsChannelCredentials(
    const TlsFiles& files);

// The credentials every outbound channel to another Trident service uses:
// plaintext until SetClusterChannelCredentials (service start-up, from the
// --tls_* flags). Thread-safe.
std::shared_ptr<grpc::ChannelCredentials> ClusterChannelCredentials();
void SetClusterChannelCredentials(std::shared_ptr<grpc::ChannelCredentials> credentials);

// grpc::CreateChannel / CreateCustomChannel with ClusterChannelCredentials().
std::shared_ptr<grpc::Channel> CreateClusterChannel(const std::string& address);
std::shared_ptr<grpc::Channel> CreateClusterChannel(const std::string& address,
                                                    const grpc::ChannelArguments& args);

}  // namespace trident

#endif  // TRIDENT_COMMON_GRPC_TLS_H_
