#include "common/grpc/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status/status_macros.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace trident {
namespace {

using grpc::experimental::FileWatcherCertificateProvider;

absl::StatusOr<std::string> ReadFile(absl::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": cannot be read"));
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();  // NOLINT(runtime/int): OpenSSL's type.
  ERR_clear_error();
  if (code == 0) return "no PEM data";
  char buffer[256];
  ERR_error_string_n(code, buffer, sizeof(buffer));
  return buffer;
}

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using UniqueBio = std::unique_ptr<BIO, BioDeleter>;
using UniqueX509 = std::unique_ptr<X509, X509Deleter>;

UniqueBio MemoryBio(const std::string& pem) {
  return UniqueBio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of `pem`, which must not have expired.
absl::StatusOr<UniqueX509> FirstCertificate(absl::string_view flag, const std::string& path,
                                            const std::string& pem) {
  UniqueBio bio = MemoryBio(pem);
  UniqueX509 cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", path, ": not a PEM certificate (", OpenSslError(), ")"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", path, ": the certificate has expired"));
  }
  return cert;
}

grpc_ssl_client_certificate_request_type RequestType(ClientAuth auth) {
  switch (auth) {
    case ClientAuth::kNone:
      return GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
    case ClientAuth::kOptional:
      return GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
    case ClientAuth::kRequire:
      break;
  }
  return GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
}

unsigned int RefreshSeconds(const TlsFiles& files) {
  return static_cast<unsigned int>(
      std::max<int64_t>(1, absl::ToInt64Seconds(files.refresh_interval)));
}

struct ClusterCredentials {
  absl::Mutex mu;
  std::shared_ptr<grpc::ChannelCredentials> credentials ABSL_GUARDED_BY(mu);
};

ClusterCredentials& Cluster() {
  static ClusterCredentials* const cluster = new ClusterCredentials();
  return *cluster;
}

}  // namespace

absl::StatusOr<ClientAuth> ParseClientAuth(absl::string_view text) {
  if (text == "none") return ClientAuth::kNone;
  if (text == "optional") return ClientAuth::kOptional;
  if (text == "require") return ClientAuth::kRequire;
  return absl::InvalidArgumentError(
      absl::StrCat("--tls_client_auth must be require, optional or none; got \"", text, "\""));
}

absl::string_view ClientAuthName(ClientAuth auth) {
  switch (auth) {
    case ClientAuth::kNone:
      return "none";
    case ClientAuth::kOptional:
      return "optional";
    case ClientAuth::kRequire:
      break;
  }
  return "require";
}

absl::Status CheckTlsFiles(const TlsFiles& files) {
  if (files.cert_file.empty() != files.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert_file and --tls_key_file go together: set both or neither");
  }
  if (!files.cert_file.empty()) {
    TRIDENT_ASSIGN_OR_RETURN(std::string cert_pem, ReadFile("--tls_cert_file", files.cert_file));
    TRIDENT_ASSIGN_OR_RETURN(std::string key_pem, ReadFile("--tls_key_file", files.key_file));
    TRIDENT_ASSIGN_OR_RETURN(UniqueX509 cert,
                             FirstCertificate("--tls_cert_file", files.cert_file, cert_pem));
    UniqueBio bio = MemoryBio(key_pem);
    std::unique_ptr<EVP_PKEY, KeyDeleter> key(
        PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
    if (key == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_key_file=", files.key_file, ": not a PEM private key (", OpenSslError(), ")"));
    }
    if (X509_check_private_key(cert.get(), key.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(
          absl::StrCat("--tls_key_file=", files.key_file,
                       ": is not the key of --tls_cert_file=", files.cert_file));
    }
  }
  if (!files.ca_file.empty()) {
    TRIDENT_ASSIGN_OR_RETURN(std::string ca_pem, ReadFile("--tls_ca_file", files.ca_file));
    TRIDENT_RETURN_IF_ERROR(FirstCertificate("--tls_ca_file", files.ca_file, ca_pem).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsServerCredentials(
    const TlsFiles& files) {
  if (files.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "serving TLS needs --tls_cert_file and --tls_key_file (and --tls_ca_file to verify "
        "clients)");
  }
  if (files.ca_file.empty() && files.client_auth != ClientAuth::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_client_auth=", ClientAuthName(files.client_auth),
                     " needs --tls_ca_file to verify client certificates"));
  }
  TRIDENT_RETURN_IF_ERROR(CheckTlsFiles(files));
  auto provider = std::make_shared<FileWatcherCertificateProvider>(
      files.key_file, files.cert_file, files.ca_file, RefreshSeconds(files));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!files.ca_file.empty()) options.watch_root_certs();
  options.set_cert_request_type(RequestType(files.client_auth));
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsChannelCredentials(
    const TlsFiles& files) {
  TRIDENT_RETURN_IF_ERROR(CheckTlsFiles(files));
  grpc::experimental::TlsChannelCredentialsOptions options;
  if (!files.ca_file.empty() || !files.cert_file.empty()) {
    if (files.ca_file.empty()) {
      return absl::InvalidArgumentError(
          "a client certificate (--tls_cert_file) needs --tls_ca_file to verify the server");
    }
    options.set_certificate_provider(std::make_shared<FileWatcherCertificateProvider>(
        files.key_file, files.cert_file, files.ca_file, RefreshSeconds(files)));
    options.watch_root_certs();
    if (!files.cert_file.empty()) options.watch_identity_key_cert_pairs();
  }
  options.set_verify_server_certs(true);
  if (!files.verify_hostname) {
    options.set_certificate_verifier(
        std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
    options.set_check_call_host(false);
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::experimental::TlsCredentials(options);
  if (credentials == nullptr) return absl::InternalError("gRPC refused the TLS client options");
  return credentials;
}

std::shared_ptr<grpc::ChannelCredentials> ClusterChannelCredentials() {
  ClusterCredentials& cluster = Cluster();
  absl::MutexLock lock(&cluster.mu);
  if (cluster.credentials == nullptr) cluster.credentials = grpc::InsecureChannelCredentials();
  return cluster.credentials;
}

void SetClusterChannelCredentials(std::shared_ptr<grpc::ChannelCredentials> credentials) {
  ClusterCredentials& cluster = Cluster();
  absl::MutexLock lock(&cluster.mu);
  cluster.credentials = std::move(credentials);
}

std::shared_ptr<grpc::Channel> CreateClusterChannel(const std::string& address) {
  return grpc::CreateChannel(address, ClusterChannelCredentials());
}

std::shared_ptr<grpc::Channel> CreateClusterChannel(const std::string& address,
                                                    const grpc::ChannelArguments& args) {
  return grpc::CreateCustomChannel(address, ClusterChannelCredentials(), args);
}

}  // namespace trident
