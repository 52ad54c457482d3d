#include "common/model/safetensors_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/numeric/fp8.h"
#include "common/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace trident::model {
namespace {

// numel * element size, or an error if a dimension is negative or the product
// overflows.
absl::StatusOr<uint64_t> ByteSize(const std::string& name, numeric::DType dtype,
                                  const std::vector<int64_t>& shape) {
  uint64_t n = numeric::ElementSize(dtype);
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\": negative dimension ", d));
    }
    if (d != 0 && n > UINT64_MAX / static_cast<uint64_t>(d)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\": size overflows"));
    }
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

}  // namespace

const char* SafetensorsDTypeName(numeric::DType dtype) {
  switch (dtype) {
    case numeric::DType::kF32:
      return "F32";
    case numeric::DType::kBF16:
      return "BF16";
    case numeric::DType::kF16:
      return "F16";
    case numeric::DType::kFP8E4M3:
      return "F8_E4M3";
  }
  return "F32";
}

absl::Status WriteStringToFile(const std::string& path, const std::string& contents) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot create ", path));
  }
  const size_t written = std::fwrite(contents.data(), 1, contents.size(), f);
  const int write_errno = errno;
  if (std::fclose(f) != 0 || written != contents.size()) {
    return absl::ErrnoToStatus(write_errno != 0 ? write_errno : EIO,
                               absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

SafetensorsWriter::SafetensorsWriter() { metadata_["format"] = "pt"; }

void SafetensorsWriter::Add(std::string name, numeric::DType dtype, std::vector<int64_t> shape,
                            std::string bytes) {
  tensors_.push_back(Tensor{std::move(name), dtype, std::move(shape), std::move(bytes)});
}

void SafetensorsWriter::AddFloats(std::string name, numeric::DType dtype,
                                  std::vector<int64_t> shape, const std::vector<float>& values) {
  std::string bytes(values.size() * numeric::ElementSize(dtype), '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case numeric::DType::kF32:
        std::memcpy(&bytes[4 * i], &values[i], 4);
        break;
      case numeric::DType::kBF16: {
        const uint16_t b = numeric::FloatToBf16(values[i]);
        std::memcpy(&bytes[2 * i], &b, 2);
        break;
      }
      case numeric::DType::kF16: {
        const uint16_t h = numeric::FloatToHalf(values[i]);
        std::memcpy(&bytes[2 * i], &h, 2);
        break;
      }
      case numeric::DType::kFP8E4M3:
        bytes[i] = static_cast<char>(numeric::FloatToFp8E4M3(values[i]));
        break;
    }
  }
  Add(std::move(name), dtype, std::move(shape), std::move(bytes));
}

void SafetensorsWriter::AddMetadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

absl::StatusOr<std::string> SafetensorsWriter::SerializeSubset(
    const std::vector<size_t>& indices) const {
  std::set<std::string> names;
  for (size_t i : indices) {
    const Tensor& t = tensors_[i];
    if (t.name.empty() || t.name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat("invalid tensor name \"", t.name, "\""));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\" added twice"));
    }
    TRIDENT_ASSIGN_OR_RETURN(const uint64_t size, ByteSize(t.name, t.dtype, t.shape));
    if (size != t.bytes.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\" has ", t.bytes.size(),
                                                     " bytes; its shape needs ", size));
    }
  }
  // Largest element first keeps every tensor aligned to its element size,
  // since the data section itself starts 8-aligned.
  std::vector<size_t> order = indices;
  std::sort(order.begin(), order.end(), [this](size_t a, size_t b) {
    const size_t ea = numeric::ElementSize(tensors_[a].dtype);
    const size_t eb = numeric::ElementSize(tensors_[b].dtype);
    if (ea != eb) return ea > eb;
    return tensors_[a].name < tensors_[b].name;
  });

  nlohmann::json header = nlohmann::json::object();
  if (!metadata_.empty()) {
    nlohmann::json meta = nlohmann::json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (size_t i : order) {
    const Tensor& t = tensors_[i];
    nlohmann::json entry = nlohmann::json::object();
    entry["dtype"] = SafetensorsDTypeName(t.dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + t.bytes.size()};
    offset += t.bytes.size();
    header[t.name] = std::move(entry);
  }
  std::string json = header.dump();
  json.append((8 - (8 + json.size()) % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + json.size() + offset);
  const uint64_t n = json.size();
  for (int b = 0; b < 8; ++b) out.push_back(static_cast<char>((n >> (8 * b)) & 0xff));
  out += json;
  for (size_t i : order) out += tensors_[i].bytes;
  return out;
}

absl::StatusOr<std::string> SafetensorsWriter::Serialize() const {
  std::vector<size_t> all(tensors_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return SerializeSubset(all);
}

absl::Status SafetensorsWriter::Write(const std::string& path) const {
  TRIDENT_ASSIGN_OR_RETURN(const std::string bytes, Serialize());
  return WriteStringToFile(path, bytes);
}

absl::Status SafetensorsWriter::WriteSharded(const std::string& dir,
                                             uint64_t max_shard_bytes) const {
  std::set<std::string> names;
  for (const Tensor& t : tensors_) {
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\" added twice"));
    }
  }
  std::vector<std::vector<size_t>> shards;
  uint64_t current_bytes = 0;
  uint64_t total_size = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const uint64_t size = tensors_[i].bytes.size();
    if (shards.empty() || (!shards.back().empty() && current_bytes + size > max_shard_bytes)) {
      shards.emplace_back();
      current_bytes = 0;
    }
    shards.back().push_back(i);
    current_bytes += size;
    total_size += size;
  }
  if (shards.empty()) shards.emplace_back();

  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file =
        absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
    TRIDENT_ASSIGN_OR_RETURN(const std::string bytes, SerializeSubset(shards[s]));
    TRIDENT_RETURN_IF_ERROR(WriteStringToFile(dir + "/" + file, bytes));
    for (size_t i : shards[s]) weight_map[tensors_[i].name] = file;
  }
  nlohmann::json index = nlohmann::json::object();
  index["metadata"] = {{"total_size", total_size}};
  index["weight_map"] = std::move(weight_map);
  return WriteStringToFile(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
}

}  // namespace trident::model
