#include "common/model/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/model/json_util.h"
#include "common/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace trident::model {
namespace {

using internal::JsonSnippet;

// An index is a few hundred kB even for the largest models.
constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;

enum class PathKind { kMissing, kFile, kDirectory, kOther };

PathKind Stat(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return PathKind::kMissing;
  if (S_ISREG(st.st_mode)) return PathKind::kFile;
  if (S_ISDIR(st.st_mode)) return PathKind::kDirectory;
  return PathKind::kOther;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path));
  }
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0 || static_cast<uint64_t>(size) > kMaxIndexBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": unreadable or larger than ", kMaxIndexBytes, " bytes"));
  }
  in.seekg(0);
  std::string text(static_cast<size_t>(size), '\0');
  if (!in.read(text.data(), size)) {
    return absl::DataLossError(absl::StrCat("cannot read ", path));
  }
  return text;
}

// A shard name must be a plain file name inside the checkpoint directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

// Converts `n` elements starting at `src` (which may be misaligned) with
// `convert`, which requires aligned input.
template <typename Out, typename Convert>
void ConvertUnaligned(numeric::DType dtype, const uint8_t* src, Out* out, size_t n,
                      Convert convert) {
  const size_t elem = numeric::ElementSize(dtype);
  if (reinterpret_cast<uintptr_t>(src) % elem == 0) {
    convert(dtype, src, out, n);
    return;
  }
  // Rare: only files whose header length is not a multiple of the element
  // size. Bounce through an aligned buffer.
  constexpr size_t kChunk = 4096;
  alignas(8) uint8_t buffer[kChunk * 4];
  for (size_t done = 0; done < n; done += kChunk) {
    const size_t count = std::min(kChunk, n - done);
    std::memcpy(buffer, src + done * elem, count * elem);
    convert(dtype, buffer, out + done, count);
  }
}

}  // namespace

absl::StatusOr<numeric::CounterStreamBlock> TensorReader::StreamBlock(
    absl::string_view name, const TensorSlice& /*slice*/) const {
  return absl::UnimplementedError(absl::StrCat("\"", name, "\" is stored, not a computed stream"));
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  switch (Stat(dir)) {
    case PathKind::kMissing:
      return absl::NotFoundError(absl::StrCat("model directory ", dir, " does not exist"));
    case PathKind::kDirectory:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(dir, " is not a directory"));
  }
  std::unique_ptr<Checkpoint> checkpoint(new Checkpoint(dir));
  const std::string single = absl::StrCat(dir, "/", kSingleSafetensorsFile);
  const std::string index_path = absl::StrCat(dir, "/", kSafetensorsIndexFile);

  // Shard file name -> tensors the index maps to it; empty for a single file.
  std::map<std::string, std::vector<std::string>> shards;
  bool sharded = false;
  if (Stat(single) == PathKind::kFile) {
    shards[kSingleSafetensorsFile];
  } else if (Stat(index_path) == PathKind::kFile) {
    sharded = true;
    TRIDENT_ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(index_path));
    TRIDENT_ASSIGN_OR_RETURN(const nlohmann::json index, internal::ParseJson(text, index_path));
    if (!index.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": not a JSON object"));
    }
    if (const auto meta = index.find("metadata"); meta != index.end()) {
      uint64_t unused;
      if (!meta->is_object() || (meta->contains("total_size") &&
                                 !internal::JsonToUint64((*meta)["total_size"], &unused))) {
        return absl::InvalidArgumentError(absl::StrCat(
            index_path, ": \"metadata\" is not an object with an integer \"total_size\""));
      }
    }
    const auto map = index.find("weight_map");
    if (map == index.end() || !map->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": \"weight_map\" is missing or not an object"));
    }
    if (map->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": \"weight_map\" is empty"));
    }
    for (const auto& [tensor, shard] : map->items()) {
      if (!shard.is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(index_path,
                                                       ": \"weight_map\" entry for tensor \"",
                                                       JsonSnippet(tensor), "\" is not a string"));
      }
      const std::string& file = shard.get_ref<const std::string&>();
      if (!IsPlainFileName(file)) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": shard \"", JsonSnippet(file),
                                                       "\" of tensor \"", JsonSnippet(tensor),
                                                       "\" is not a file name inside ", dir));
      }
      shards[file].push_back(tensor);
    }
  } else {
    std::error_code ec;
    std::vector<std::string> found;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (absl::EndsWith(name, ".safetensors") &&
          Stat(absl::StrCat(dir, "/", name)) == PathKind::kFile) {
        found.push_back(name);
      }
    }
    if (ec) {
      return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot list ", dir));
    }
    if (found.empty()) {
      return absl::NotFoundError(absl::StrCat("no ", kSingleSafetensorsFile, ", ",
                                              kSafetensorsIndexFile,
                                              " or other *.safetensors file in ", dir));
    }
    if (found.size() > 1) {
      std::sort(found.begin(), found.end());
      return absl::FailedPreconditionError(
          absl::StrCat(dir, " holds ", found.size(), " *.safetensors files (", found[0], ", ",
                       found[1], ", ...) but no ", kSafetensorsIndexFile));
    }
    shards[found[0]];
  }

  // Tensor name -> shard file holding it, to catch a tensor in two shards.
  std::map<std::string, std::string, std::less<>> owner;
  for (const auto& [shard, mapped] : shards) {
    const std::string path = absl::StrCat(dir, "/", shard);
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      if (sharded && absl::IsNotFound(file.status())) {
        return Annotate(file.status(), absl::StrCat(index_path, ": shard \"", shard,
                                                    "\" (of tensor \"", mapped.front(), "\")"));
      }
      return file.status();
    }
    checkpoint->files_.push_back(std::make_unique<SafetensorsFile>(*std::move(file)));
    const SafetensorsFile* opened = checkpoint->files_.back().get();
    for (const SafetensorsTensor& tensor : opened->tensors()) {
      const auto [it, inserted] = owner.emplace(tensor.name, shard);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor \"", JsonSnippet(tensor.name),
                                                       "\" is in both ", it->second, " and ",
                                                       shard));
      }
      checkpoint->tensors_.emplace(tensor.name, Entry{opened, &tensor});
      checkpoint->total_bytes_ += tensor.num_bytes();
    }
    for (const std::string& tensor : mapped) {
      if (opened->Find(tensor) == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": maps tensor \"",
                                                       JsonSnippet(tensor), "\" to ", shard,
                                                       ", which does not contain it"));
      }
    }
  }
  return checkpoint;
}

bool Checkpoint::Has(absl::string_view name) const { return tensors_.find(name) != tensors_.end(); }

absl::StatusOr<Checkpoint::Entry> Checkpoint::Find(absl::string_view name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no tensor \"", name, "\" in the checkpoint in ", dir_));
  }
  return it->second;
}

absl::StatusOr<TensorInfo> Checkpoint::Info(absl::string_view name) const {
  TRIDENT_ASSIGN_OR_RETURN(const Entry entry, Find(name));
  TensorInfo info;
  info.name = entry.tensor->name;
  info.file = entry.file->path();
  info.dtype_name = entry.tensor->dtype_name;
  info.dtype = entry.tensor->dtype;
  info.shape = entry.tensor->shape;
  info.numel = entry.tensor->numel;
  info.num_bytes = entry.tensor->num_bytes();
  return info;
}

absl::StatusOr<absl::Span<const uint8_t>> Checkpoint::RawBytes(absl::string_view name) const {
  TRIDENT_ASSIGN_OR_RETURN(const Entry entry, Find(name));
  return entry.file->TensorBytes(name);
}

absl::StatusOr<Checkpoint::Entry> Checkpoint::FindForRead(absl::string_view name,
                                                          size_t out_size) const {
  TRIDENT_ASSIGN_OR_RETURN(const Entry entry, Find(name));
  TRIDENT_RETURN_IF_ERROR(entry.file->TensorBytes(name).status());
  if (static_cast<uint64_t>(entry.tensor->numel) != out_size) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" in ", entry.file->path(),
                                                   " has ", entry.tensor->numel,
                                                   " elements; the output holds ", out_size));
  }
  return entry;
}

absl::Status Checkpoint::ReadFloat(absl::string_view name, absl::Span<float> out) const {
  TRIDENT_ASSIGN_OR_RETURN(const Entry entry, FindForRead(name, out.size()));
  ConvertUnaligned(*entry.tensor->dtype, entry.file->RawBytes(*entry.tensor).data(), out.data(),
                   out.size(), [](numeric::DType t, const void* src, float* dst, size_t n) {
                     numeric::ToFloat(t, src, dst, n);
                   });
  return absl::OkStatus();
}

absl::Status Checkpoint::ReadBf16(absl::string_view name, absl::Span<uint16_t> out) const {
  TRIDENT_ASSIGN_OR_RETURN(const Entry entry, FindForRead(name, out.size()));
  ConvertUnaligned(*entry.tensor->dtype, entry.file->RawBytes(*entry.tensor).data(), out.data(),
                   out.size(), [](numeric::DType t, const void* src, uint16_t* dst, size_t n) {
                     numeric::ToBf16(t, src, dst, n);
                   });
  return absl::OkStatus();
}

template <typename Out, typename Convert>
absl::Status Checkpoint::ReadSlice(absl::string_view name, const TensorSlice& slice,
                                   absl::Span<Out> out, Convert convert) const {
  TRIDENT_ASSIGN_OR_RETURN(const Entry entry, Find(name));
  TRIDENT_RETURN_IF_ERROR(entry.file->TensorBytes(name).status());
  const std::vector<int64_t>& shape = entry.tensor->shape;
  const std::string where = absl::StrCat("tensor \"", name, "\" in ", entry.file->path());
  if (shape.empty() || shape.size() > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has ", shape.size(), " dimensions; slices need 1 or 2"));
  }
  const bool columns = slice.axis == SliceAxis::kColumns;
  if (columns && shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is 1-D: it has no columns"));
  }
  const int64_t rows = shape[0];
  const int64_t row_length = shape.size() == 2 ? shape[1] : 1;
  const int64_t extent = columns ? row_length : rows;
  if (slice.begin < 0 || slice.end > extent || slice.begin >= slice.end) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", columns ? "columns" : "rows", " [", slice.begin, ", ", slice.end,
                     ") are not a non-empty part of [0, ", extent, ")"));
  }
  const int64_t width = slice.end - slice.begin;
  const int64_t want = columns ? rows * width : width * row_length;
  if (static_cast<int64_t>(out.size()) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the slice has ", want, " elements; the output holds ", out.size()));
  }
  const numeric::DType dtype = *entry.tensor->dtype;
  const size_t elem = numeric::ElementSize(dtype);
  const uint8_t* base = entry.file->RawBytes(*entry.tensor).data();
  if (!columns) {
    ConvertUnaligned(dtype, base + slice.begin * row_length * elem, out.data(), out.size(),
                     convert);
    return absl::OkStatus();
  }
  for (int64_t r = 0; r < rows; ++r) {
    ConvertUnaligned(dtype, base + (r * row_length + slice.begin) * elem, out.data() + r * width,
                     static_cast<size_t>(width), convert);
  }
  return absl::OkStatus();
}

absl::Status Checkpoint::ReadFloatSlice(absl::string_view name, const TensorSlice& slice,
                                        absl::Span<float> out) const {
  return ReadSlice(name, slice, out, [](numeric::DType t, const void* src, float* dst, size_t n) {
    numeric::ToFloat(t, src, dst, n);
  });
}

absl::Status Checkpoint::ReadBf16Slice(absl::string_view name, const TensorSlice& slice,
                                       absl::Span<uint16_t> out) const {
  return ReadSlice(name, slice, out,
                   [](numeric::DType t, const void* src, uint16_t* dst, size_t n) {
                     numeric::ToBf16(t, src, dst, n);
                   });
}

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, unused] : tensors_) names.push_back(name);
  return names;
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> paths;
  for (const auto& file : files_) paths.push_back(file->path());
  return paths;
}

}  // namespace trident::model
