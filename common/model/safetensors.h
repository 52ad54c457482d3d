// Reading safetensors files (https://github.com/huggingface/safetensors):
//
//   offset 0        8                8+N                                file_size
//          | u64 N  | JSON header    | data section                     |
//                                    ^ data_offsets are relative to here
//
// The header is a JSON object mapping each tensor name to
//   {"dtype": "BF16", "shape": [4096, 4096], "data_offsets": [begin, end]}
// plus an optional "__metadata__" object of string to string. The parser
// checks every byte of it, as the reference Rust implementation does: the
// tensors must tile the data section exactly (no overlap, no hole, nothing
// left over at the end), each tensor's byte range must equal
// numel * element size, and each must start at a multiple of its element size.

#ifndef TRIDENT_COMMON_MODEL_SAFETENSORS_H_
#define TRIDENT_COMMON_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"
#include "absl/types/span.h"
#include "common/numeric/dtype.h"

namespace trident::model {

// Largest header accepted, in bytes (the Rust implementation caps it at 100 MB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

// One tensor entry of a header.
struct SafetensorsTensor {
  std::string name;
  // The dtype string in the file: "BF16", "F16", "F32", "I64", "F8_E4M3", ...
  std::string dtype_name;
  // Set for the types Trident computes with (F32, BF16, F16). Known types it
  // does not compute with (I64, BOOL, F8_E4M3, ...) parse fine and leave this
  // empty; reading such a tensor is kFailedPrecondition.
  absl::optional<numeric::DType> dtype;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  // Byte range [data_begin, data_end) relative to the data section.
  uint64_t data_begin = 0;
  uint64_t data_end = 0;

  uint64_t num_bytes() const { return data_end - data_begin; }
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;  // N.
  uint64_t data_offset = 0;   // 8 + N: where the data section starts in the file.
  uint64_t data_bytes = 0;    // file_size - data_offset.
  // Sorted by name.
  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Parses and validates the header of a safetensors file of `file_size` bytes
// whose first bytes are `prefix`; `file_name` only labels error messages.
// Returns:
//  - kInvalidArgument, naming the file (and the tensor where there is one), for
//    any malformed header: file shorter than 8 bytes; N above
//    kMaxSafetensorsHeaderBytes or past the end of the file; invalid JSON or
//    UTF-8; not an object; a repeated key; a tensor entry that is not an object
//    of exactly "dtype", "shape" and "data_offsets"; an unknown dtype; a shape
//    that is not an array of non-negative integers or whose byte size
//    overflows; data_offsets that are not two integers begin <= end; a byte
//    range whose length differs from the shape's; a range past the end of the
//    file (truncated); a begin not a multiple of the element size; tensors
//    that overlap or leave bytes of the data section uncovered; a
//    "__metadata__" that is not an object of strings.
//  - kOutOfRange if `prefix` is shorter than 8 + N bytes although the file is
//    long enough (the caller must pass more of the file).
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view prefix,
                                                         uint64_t file_size,
                                                         absl::string_view file_name);

// A safetensors file mapped read-only (mmap, MAP_PRIVATE) with its parsed
// header. Tensor bytes are read straight from the mapping, so pages are loaded
// on first touch. Truncating or rewriting the file while it is open is
// undefined (SIGBUS), as with any mapping.
//
// Movable, not copyable; unmaps in the destructor. Thread-safe for concurrent
// reads (const methods).
class SafetensorsFile {
 public:
  // Maps `path` and parses its header. The errno-derived status naming the
  // path if it cannot be opened (kNotFound if missing) or mapped;
  // kInvalidArgument if it is not a regular file or its header is malformed
  // (see ParseSafetensorsHeader).
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  const SafetensorsHeader& header() const { return header_; }
  // Sorted by name.
  const std::vector<SafetensorsTensor>& tensors() const { return header_.tensors; }

  // The tensor called `name`, or nullptr. The pointer lives as long as this
  // object (it moves with it).
  const SafetensorsTensor* Find(absl::string_view name) const;

  // The tensor's bytes in the mapping, whatever its dtype (possibly not
  // aligned to its element size if the header length N is not a multiple of
  // 8). REQUIRES: `tensor` comes from this file's tensors().
  absl::Span<const uint8_t> RawBytes(const SafetensorsTensor& tensor) const;

  // The bytes of `name`: kNotFound naming the file and tensor if absent,
  // kFailedPrecondition if its dtype is one Trident does not compute with.
  absl::StatusOr<absl::Span<const uint8_t>> TensorBytes(absl::string_view name) const;

 private:
  SafetensorsFile(std::string path, const uint8_t* base, uint64_t size, SafetensorsHeader header)
      : path_(std::move(path)), base_(base), size_(size), header_(std::move(header)) {}
  void Unmap();

  std::string path_;
  const uint8_t* base_ = nullptr;  // Owned mapping of size_ bytes.
  uint64_t size_ = 0;
  SafetensorsHeader header_;
};

}  // namespace trident::model

#endif  // TRIDENT_COMMON_MODEL_SAFETENSORS_H_
