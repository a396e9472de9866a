#include "services/tandemctl/certs_init.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/posix.h"
#include "common/base/status_macros.h"

namespace tandem::certs {
namespace {

constexpr const char* kRoles[] = {"coordinator", "trainer", "rollout",
                                  "verifier", "admin"};

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;
using BioPtr = std::unique_ptr<BIO, BioFree>;

// The OpenSSL error queue as text (and emptied), after `what`.
absl::Status OpenSslError(const std::string& what) {
  std::string detail;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&detail, detail.empty() ? "" : "; ", buf);
  }
  return absl::InternalError(
      absl::StrCat(what, detail.empty() ? "" : ": ", detail));
}

// Replaces `path` with `data` (mode `mode`, whatever the umask): a temp file
// in the same directory, fsync, rename.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& data, mode_t mode) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, mode);
  if (fd < 0) return PosixError(errno, absl::StrCat("create ", tmp));
  absl::Status status;
  if (fchmod(fd, mode) != 0) status = PosixError(errno, "chmod " + tmp);
  size_t done = 0;
  while (status.ok() && done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) status = PosixError(errno, "write " + tmp);
    if (n > 0) done += static_cast<size_t>(n);
  }
  if (status.ok() && fsync(fd) != 0) status = PosixError(errno, "fsync " + tmp);
  close(fd);
  if (status.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    status = PosixError(errno, absl::StrCat("rename ", tmp, " to ", path));
  }
  if (!status.ok()) unlink(tmp.c_str());
  return status;
}

absl::StatusOr<std::string> CertPem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_X509(bio.get(), cert) != 1) {
    return OpenSslError("PEM-encode certificate");
  }
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

absl::StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr,
                               nullptr) != 1) {
    return OpenSslError("PEM-encode private key");
  }
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

absl::StatusOr<PkeyPtr> NewKey() {
  PkeyPtr key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("generate an EC P-256 key");
  return key;
}

absl::Status AddExtension(X509* cert, X509V3_CTX* ctx, int nid,
                          const std::string& value) {
  X509_EXTENSION* ext =
      X509V3_EXT_conf_nid(nullptr, ctx, nid, const_cast<char*>(value.c_str()));
  if (ext == nullptr) {
    return OpenSslError(
        absl::StrCat("extension ", OBJ_nid2sn(nid), " = ", value));
  }
  const int added = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (added != 1) return OpenSslError(absl::StrCat("add ", OBJ_nid2sn(nid)));
  return absl::OkStatus();
}

// A version 3 certificate for `key` named O=Tandem, CN=`common_name`, valid
// from an hour ago (clock skew between machines) for `days`, with a random
// 127-bit serial. Extensions and the signature are added by the caller.
absl::StatusOr<X509Ptr> NewCertificate(EVP_PKEY* key,
                                       const std::string& common_name,
                                       int days) {
  X509Ptr cert(X509_new());
  if (cert == nullptr) return OpenSslError("allocate a certificate");
  X509_set_version(cert.get(), X509_VERSION_3);
  std::unique_ptr<BIGNUM, decltype(&BN_free)> serial(BN_new(), BN_free);
  if (serial == nullptr ||
      BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) ==
          nullptr) {
    return OpenSslError("make a serial number");
  }
  if (X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) == nullptr ||
      X509_time_adj_ex(X509_getm_notAfter(cert.get()), days, 0, nullptr) ==
          nullptr) {
    return OpenSslError("set the validity period");
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  const auto* o = reinterpret_cast<const unsigned char*>("Tandem");
  const auto* cn = reinterpret_cast<const unsigned char*>(common_name.c_str());
  if (X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, o, -1, -1, 0) != 1 ||
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, cn, -1, -1, 0) !=
          1 ||
      X509_set_pubkey(cert.get(), key) != 1) {
    return OpenSslError("set subject and public key");
  }
  return cert;
}

struct Authority {
  X509Ptr cert;
  PkeyPtr key;
};

absl::StatusOr<Authority> MakeAuthority(int days) {
  Authority ca;
  ASSIGN_OR_RETURN(ca.key, NewKey());
  ASSIGN_OR_RETURN(ca.cert,
                   NewCertificate(ca.key.get(), "Tandem development CA", days));
  X509_set_issuer_name(ca.cert.get(), X509_get_subject_name(ca.cert.get()));
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, ca.cert.get(), ca.cert.get(), nullptr, nullptr, 0);
  RETURN_IF_ERROR(AddExtension(ca.cert.get(), &ctx, NID_basic_constraints,
                               "critical,CA:TRUE,pathlen:0"));
  RETURN_IF_ERROR(AddExtension(ca.cert.get(), &ctx, NID_key_usage,
                               "critical,keyCertSign,cRLSign"));
  RETURN_IF_ERROR(
      AddExtension(ca.cert.get(), &ctx, NID_subject_key_identifier, "hash"));
  if (X509_sign(ca.cert.get(), ca.key.get(), EVP_sha256()) == 0) {
    return OpenSslError("sign the CA certificate");
  }
  return ca;
}

absl::StatusOr<Authority> LoadAuthority(const std::string& cert_path,
                                        const std::string& key_path) {
  Authority ca;
  {
    std::unique_ptr<FILE, decltype(&fclose)> f(fopen(cert_path.c_str(), "r"),
                                               fclose);
    if (f == nullptr) return PosixError(errno, "open " + cert_path);
    ca.cert.reset(PEM_read_X509(f.get(), nullptr, nullptr, nullptr));
    if (ca.cert == nullptr) return OpenSslError("read " + cert_path);
  }
  {
    std::unique_ptr<FILE, decltype(&fclose)> f(fopen(key_path.c_str(), "r"),
                                               fclose);
    if (f == nullptr) return PosixError(errno, "open " + key_path);
    ca.key.reset(
        PEM_read_PrivateKey(f.get(), nullptr, nullptr, const_cast<char*>("")));
    if (ca.key == nullptr) return OpenSslError("read " + key_path);
  }
  if (X509_check_private_key(ca.cert.get(), ca.key.get()) != 1) {
    return OpenSslError(
        absl::StrCat(key_path, " does not belong to ", cert_path));
  }
  return ca;
}

// "URI:spiffe://tandem/<role>/<name>,DNS:host,IP:1.2.3.4,..."
std::string SubjectAltNames(const std::string& role, const std::string& name,
                            const std::vector<std::string>& hosts) {
  std::vector<std::string> sans = {
      absl::StrCat("URI:spiffe://tandem/", role, "/", name)};
  for (const std::string& host : hosts) {
    unsigned char buf[16];
    const bool ip = inet_pton(AF_INET, host.c_str(), buf) == 1 ||
                    inet_pton(AF_INET6, host.c_str(), buf) == 1;
    sans.push_back(absl::StrCat(ip ? "IP:" : "DNS:", host));
  }
  return absl::StrJoin(sans, ",");
}

absl::Status IssueRole(const Authority& ca, const std::string& role,
                       const CertsInitOptions& options) {
  ASSIGN_OR_RETURN(PkeyPtr key, NewKey());
  ASSIGN_OR_RETURN(
      X509Ptr cert,
      NewCertificate(key.get(), absl::StrCat("tandem-", role), options.days));
  X509_set_issuer_name(cert.get(), X509_get_subject_name(ca.cert.get()));
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, ca.cert.get(), cert.get(), nullptr, nullptr, 0);
  RETURN_IF_ERROR(AddExtension(cert.get(), &ctx, NID_basic_constraints,
                               "critical,CA:FALSE"));
  RETURN_IF_ERROR(AddExtension(cert.get(), &ctx, NID_key_usage,
                               "critical,digitalSignature,keyAgreement"));
  RETURN_IF_ERROR(AddExtension(cert.get(), &ctx, NID_ext_key_usage,
                               "serverAuth,clientAuth"));
  RETURN_IF_ERROR(
      AddExtension(cert.get(), &ctx, NID_subject_alt_name,
                   SubjectAltNames(role, options.name, options.hosts)));
  RETURN_IF_ERROR(
      AddExtension(cert.get(), &ctx, NID_subject_key_identifier, "hash"));
  RETURN_IF_ERROR(AddExtension(cert.get(), &ctx, NID_authority_key_identifier,
                               "keyid:always"));
  if (X509_sign(cert.get(), ca.key.get(), EVP_sha256()) == 0) {
    return OpenSslError(absl::StrCat("sign the ", role, " certificate"));
  }
  const std::filesystem::path dir(options.dir);
  ASSIGN_OR_RETURN(std::string key_pem, KeyPem(key.get()));
  ASSIGN_OR_RETURN(std::string cert_pem, CertPem(cert.get()));
  // The key first: a watcher that reads the pair between the two renames
  // sees the new key with the old certificate for one refresh at most.
  RETURN_IF_ERROR(WriteFileAtomically(
      (dir / (role + std::string(".key"))).string(), key_pem, 0600));
  RETURN_IF_ERROR(WriteFileAtomically(
      (dir / (role + std::string(".pem"))).string(), cert_pem, 0644));
  return absl::OkStatus();
}

absl::Status CertsInit(const CertsInitOptions& options, std::ostream& out) {
  if (options.dir.empty())
    return absl::InvalidArgumentError("--dir is required");
  if (options.days < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--days must be at least 1, got ", options.days));
  }
  if (options.name.empty() || options.name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--name must be non-empty without '/', got '", options.name, "'"));
  }
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) return FilesystemError(ec, options.dir, "create directory");
  const std::filesystem::path ca_dir(options.ca_dir.empty() ? options.dir
                                                            : options.ca_dir);
  const std::string ca_cert = (ca_dir / "ca.pem").string();
  const std::string ca_key = (ca_dir / "ca.key").string();
  Authority ca;
  if (std::filesystem::exists(ca_cert) && std::filesystem::exists(ca_key)) {
    ASSIGN_OR_RETURN(ca, LoadAuthority(ca_cert, ca_key));
    out << "using the CA in " << ca_cert << "\n";
  } else if (!options.ca_dir.empty()) {
    return absl::NotFoundError(
        absl::StrCat("--ca-dir ", options.ca_dir, " has no ca.pem and ca.key"));
  } else {
    ASSIGN_OR_RETURN(ca, MakeAuthority(options.days * 10));
    ASSIGN_OR_RETURN(std::string key_pem, KeyPem(ca.key.get()));
    ASSIGN_OR_RETURN(std::string cert_pem, CertPem(ca.cert.get()));
    RETURN_IF_ERROR(WriteFileAtomically(ca_key, key_pem, 0600));
    RETURN_IF_ERROR(WriteFileAtomically(ca_cert, cert_pem, 0644));
    out << "wrote a new CA: " << ca_cert << ", " << ca_key << "\n";
  }
  if (ca_dir != std::filesystem::path(options.dir)) {
    // The daemons' tls.ca is D/ca.pem whichever directory signed.
    ASSIGN_OR_RETURN(std::string cert_pem, CertPem(ca.cert.get()));
    RETURN_IF_ERROR(WriteFileAtomically(
        (std::filesystem::path(options.dir) / "ca.pem").string(), cert_pem,
        0644));
  }
  for (const char* role : kRoles) {
    RETURN_IF_ERROR(IssueRole(ca, role, options));
    out << "wrote " << options.dir << "/" << role << ".pem and " << role
        << ".key (spiffe://tandem/" << role << "/" << options.name << "; "
        << absl::StrJoin(options.hosts, ", ") << "; " << options.days
        << " days)\n";
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteDevCertificates(const CertsInitOptions& options) {
  std::ostringstream quiet;
  return CertsInit(options, quiet);
}

void AddCertsInitFlags(CLI::App* app, CertsInitOptions* options) {
  app->add_option("--dir", options->dir,
                  "Directory for ca.pem and <role>.pem/.key")
      ->required();
  app->add_option("--ca-dir", options->ca_dir,
                  "Sign with the ca.pem and ca.key in this directory "
                  "(default: --dir, where a new CA is made if it has none)");
  app->add_option("--days", options->days,
                  "Validity of the role certificates in days");
  app->add_option("--hosts", options->hosts,
                  "DNS names and IP addresses the certificates are valid for")
      ->delimiter(',');
  app->add_option("--name", options->name,
                  "<name> in each certificate's spiffe://tandem/<role>/<name>");
}

int RunCertsInit(const CertsInitOptions& options) {
  if (absl::Status s = CertsInit(options, std::cout); !s.ok()) {
    std::cerr << "tandemctl certs init: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace tandem::certs
