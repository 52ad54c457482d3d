#include "common/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/json_util.h"
#include "common/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace trident::model {
namespace {

using internal::JsonSnippet;

struct DTypeSpec {
  const char* name;
  int bits;
  absl::optional<numeric::DType> dtype;
};

// Every dtype the reference implementation knows. Only the last three are
// ones Trident computes with.
const DTypeSpec kDTypes[] = {
    {"BOOL", 8, absl::nullopt},
    {"U8", 8, absl::nullopt},
    {"I8", 8, absl::nullopt},
    {"F8_E5M2", 8, absl::nullopt},
    {"F8_E4M3", 8, absl::nullopt},
    {"F8_E8M0", 8, absl::nullopt},
    {"F4", 4, absl::nullopt},
    {"F6_E2M3", 6, absl::nullopt},
    {"F6_E3M2", 6, absl::nullopt},
    {"I16", 16, absl::nullopt},
    {"U16", 16, absl::nullopt},
    {"I32", 32, absl::nullopt},
    {"U32", 32, absl::nullopt},
    {"F64", 64, absl::nullopt},
    {"I64", 64, absl::nullopt},
    {"U64", 64, absl::nullopt},
    {"C64", 64, absl::nullopt},
    {"F32", 32, numeric::DType::kF32},
    {"BF16", 16, numeric::DType::kBF16},
    {"F16", 16, numeric::DType::kF16},
};

const DTypeSpec* FindDType(const std::string& name) {
  for (const DTypeSpec& spec : kDTypes) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

// Validates one tensor entry (everything that does not depend on the other
// tensors) and fills `out`.
absl::Status ParseTensor(absl::string_view file, const std::string& name,
                         const nlohmann::json& entry, uint64_t data_bytes, SafetensorsTensor* out) {
  auto error = [&](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": tensor \"", JsonSnippet(name), "\": ", parts...));
  };
  if (!entry.is_object()) return error("entry is ", entry.type_name(), ", not an object");
  for (const auto& [key, unused] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return error("unknown key \"", JsonSnippet(key), "\"");
    }
  }
  const auto dtype_it = entry.find("dtype");
  const auto shape_it = entry.find("shape");
  const auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end()) return error("missing \"dtype\"");
  if (shape_it == entry.end()) return error("missing \"shape\"");
  if (offsets_it == entry.end()) return error("missing \"data_offsets\"");

  if (!dtype_it->is_string()) return error("\"dtype\" is not a string");
  out->name = name;
  out->dtype_name = dtype_it->get<std::string>();
  const DTypeSpec* spec = FindDType(out->dtype_name);
  if (spec == nullptr) return error("unknown dtype \"", JsonSnippet(out->dtype_name), "\"");
  out->dtype = spec->dtype;

  if (!shape_it->is_array()) return error("\"shape\" is not an array");
  uint64_t numel = 1;
  for (const nlohmann::json& dim : *shape_it) {
    int64_t d = 0;
    if (!internal::JsonToInt64(dim, &d) || d < 0) {
      return error("shape dimension ", JsonSnippet(dim), " is not a non-negative integer");
    }
    if (d != 0 && numel > static_cast<uint64_t>(INT64_MAX) / static_cast<uint64_t>(d)) {
      return error("shape ", JsonSnippet(*shape_it), " has too many elements");
    }
    numel *= static_cast<uint64_t>(d);
    out->shape.push_back(d);
  }
  out->numel = static_cast<int64_t>(numel);
  // numel <= INT64_MAX < 2^63, and bits <= 64 = 2^6: check before multiplying.
  if (numel > UINT64_MAX / static_cast<uint64_t>(spec->bits)) {
    return error("byte size of shape ", absl::StrJoin(out->shape, "x"), " overflows");
  }
  const uint64_t bits = numel * static_cast<uint64_t>(spec->bits);
  if (bits % 8 != 0) {
    return error(numel, " elements of ", out->dtype_name, " do not fill whole bytes");
  }
  const uint64_t expected_bytes = bits / 8;

  if (!offsets_it->is_array() || offsets_it->size() != 2 ||
      !internal::JsonToUint64((*offsets_it)[0], &out->data_begin) ||
      !internal::JsonToUint64((*offsets_it)[1], &out->data_end)) {
    return error("\"data_offsets\" is not [begin, end] with non-negative integers");
  }
  if (out->data_begin > out->data_end) {
    return error("data_offsets [", out->data_begin, ", ", out->data_end, "] has begin after end");
  }
  if (out->data_end - out->data_begin != expected_bytes) {
    return error("data_offsets [", out->data_begin, ", ", out->data_end, "] span ",
                 out->data_end - out->data_begin, " bytes but shape [",
                 absl::StrJoin(out->shape, ", "), "] of ", out->dtype_name, " needs ",
                 expected_bytes);
  }
  if (out->data_end > data_bytes) {
    return error("data_offsets [", out->data_begin, ", ", out->data_end,
                 "] run past the end of the data section (", data_bytes,
                 " bytes); the file is truncated");
  }
  const uint64_t alignment = std::max(1, spec->bits / 8);
  if (out->data_begin % alignment != 0) {
    return error("data begins at byte ", out->data_begin, ", not a multiple of the ", alignment,
                 "-byte element size (misaligned)");
  }
  return absl::OkStatus();
}

// The tensors must tile [0, data_bytes) exactly.
absl::Status CheckCoverage(absl::string_view file, const std::vector<SafetensorsTensor>& tensors,
                           uint64_t data_bytes) {
  std::vector<const SafetensorsTensor*> order;
  order.reserve(tensors.size());
  for (const SafetensorsTensor& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
    if (a->data_begin != b->data_begin) return a->data_begin < b->data_begin;
    return a->data_end < b->data_end;
  });
  uint64_t covered = 0;
  const SafetensorsTensor* previous = nullptr;
  for (const SafetensorsTensor* t : order) {
    if (t->data_begin < covered) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": tensor \"", JsonSnippet(t->name), "\" [", t->data_begin, ", ",
                       t->data_end, ") overlaps tensor \"", JsonSnippet(previous->name), "\" [",
                       previous->data_begin, ", ", previous->data_end, ")"));
    }
    if (t->data_begin > covered) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": bytes [", covered, ", ", t->data_begin,
                       ") of the data section belong to no tensor (hole before tensor \"",
                       JsonSnippet(t->name), "\")"));
    }
    covered = t->data_end;
    previous = t;
  }
  if (covered != data_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": bytes [", covered, ", ", data_bytes,
                     ") at the end of the data section belong to no tensor"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view prefix,
                                                         uint64_t file_size,
                                                         absl::string_view file_name) {
  if (prefix.size() > file_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": ", prefix.size(), " bytes given for a file of ", file_size));
  }
  if (file_size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": file has ", file_size,
                                                   " bytes; a safetensors file starts with 8"));
  }
  if (prefix.size() < 8) {
    return absl::OutOfRangeError(absl::StrCat(file_name, ": need the first 8 bytes"));
  }
  uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | static_cast<uint8_t>(prefix[b]);
  if (n > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": header length ", n,
                                                   " exceeds the limit of ",
                                                   kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (n > file_size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        file_name, ": header length ", n, " runs past the end of the ", file_size, "-byte file"));
  }
  if (prefix.size() < 8 + n) {
    return absl::OutOfRangeError(
        absl::StrCat(file_name, ": need the first ", 8 + n, " bytes to parse the header"));
  }
  SafetensorsHeader header;
  header.header_bytes = n;
  header.data_offset = 8 + n;
  header.data_bytes = file_size - header.data_offset;

  TRIDENT_ASSIGN_OR_RETURN(
      nlohmann::json json,
      internal::ParseJson(prefix.substr(8, n), absl::StrCat(file_name, ": header")));
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": header is ", json.type_name(), ", not an object"));
  }
  // nlohmann objects iterate in key order, so tensors come out sorted by name.
  for (const auto& [key, value] : json.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(file_name, ": \"__metadata__\" is not an object"));
      }
      for (const auto& [meta_key, meta_value] : value.items()) {
        if (!meta_value.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(file_name, ": \"__metadata__\" value \"",
                                                         JsonSnippet(meta_key),
                                                         "\" is not a string"));
        }
        header.metadata[meta_key] = meta_value.get<std::string>();
      }
      continue;
    }
    SafetensorsTensor tensor;
    TRIDENT_RETURN_IF_ERROR(ParseTensor(file_name, key, value, header.data_bytes, &tensor));
    header.tensors.push_back(std::move(tensor));
  }
  TRIDENT_RETURN_IF_ERROR(CheckCoverage(file_name, header.tensors, header.data_bytes));
  return header;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open ", path));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat("cannot stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": file has ", size, " bytes; a safetensors file starts with 8"));
  }
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);  // The mapping keeps the file alive.
  if (base == MAP_FAILED) {
    return absl::ErrnoToStatus(mmap_errno, absl::StrCat("cannot mmap ", path));
  }
  const uint8_t* bytes = static_cast<const uint8_t*>(base);
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(
      absl::string_view(reinterpret_cast<const char*>(bytes), size), size, path);
  if (!header.ok()) {
    ::munmap(base, size);
    return header.status();
  }
  return SafetensorsFile(path, bytes, size, *std::move(header));
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      header_(std::move(other.header_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    header_ = std::move(other.header_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { Unmap(); }

void SafetensorsFile::Unmap() {
  if (base_ != nullptr) {
    ::munmap(const_cast<uint8_t*>(base_), size_);
    base_ = nullptr;
    size_ = 0;
  }
}

const SafetensorsTensor* SafetensorsFile::Find(absl::string_view name) const {
  const auto it =
      std::lower_bound(header_.tensors.begin(), header_.tensors.end(), name,
                       [](const SafetensorsTensor& t, absl::string_view n) { return t.name < n; });
  if (it == header_.tensors.end() || it->name != name) return nullptr;
  return &*it;
}

absl::Span<const uint8_t> SafetensorsFile::RawBytes(const SafetensorsTensor& tensor) const {
  return absl::Span<const uint8_t>(base_ + header_.data_offset + tensor.data_begin,
                                   tensor.num_bytes());
}

absl::StatusOr<absl::Span<const uint8_t>> SafetensorsFile::TensorBytes(
    absl::string_view name) const {
  const SafetensorsTensor* tensor = Find(name);
  if (tensor == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor \"", name, "\""));
  }
  if (!tensor->dtype.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": tensor \"", name, "\" has dtype ",
                                                      tensor->dtype_name,
                                                      "; Trident reads only F32, BF16 and F16"));
  }
  return RawBytes(*tensor);
}

}  // namespace trident::model
