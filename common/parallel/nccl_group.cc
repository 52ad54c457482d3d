#include "common/parallel/nccl_group.h"

#include <nccl.h>

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trident::parallel {
namespace {

absl::Status NcclError(const char* what, ncclResult_t result) {
  const std::string message = absl::StrCat("NCCL ", what, ": ", ncclGetErrorString(result));
  if (result == ncclInvalidArgument || result == ncclInvalidUsage) {
    return absl::InvalidArgumentError(message);
  }
  return absl::InternalError(message);
}

}  // namespace

struct NcclGroup::Comms {
  std::vector<ncclComm_t> comms;
  ~Comms() {
    for (ncclComm_t comm : comms) {
      if (comm != nullptr) ncclCommDestroy(comm);
    }
  }
};

absl::StatusOr<std::unique_ptr<NcclGroup>> NcclGroup::Create(const std::vector<int>& devices) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("NcclGroup: no CUDA device (", cudaGetErrorString(error), ")"));
  }
  if (devices.empty()) return absl::InvalidArgumentError("NcclGroup: no devices given");
  std::set<int> seen;
  for (int device : devices) {
    if (device < 0 || device >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat("NcclGroup: device ", device, " is not in [0, ", count, ")"));
    }
    if (!seen.insert(device).second) {
      return absl::InvalidArgumentError(absl::StrCat("NcclGroup: device ", device, " repeated"));
    }
  }
  auto comms = std::make_unique<Comms>();
  comms->comms.assign(devices.size(), nullptr);
  const ncclResult_t result =
      ncclCommInitAll(comms->comms.data(), static_cast<int>(devices.size()), devices.data());
  if (result != ncclSuccess) {
    comms->comms.assign(devices.size(), nullptr);  // Nothing was made.
    return NcclError("init", result);
  }
  return std::unique_ptr<NcclGroup>(new NcclGroup(devices, std::move(comms)));
}

NcclGroup::NcclGroup(std::vector<int> devices, std::unique_ptr<Comms> comms)
    : devices_(std::move(devices)), comms_(std::move(comms)) {}

NcclGroup::~NcclGroup() = default;

absl::Status NcclGroup::AllReduceSum(absl::Span<void* const> buffers, size_t count,
                                     numeric::DType dtype, absl::Span<const cudaStream_t> streams) {
  if (buffers.size() != devices_.size() || streams.size() != devices_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("NcclGroup::AllReduceSum: ", buffers.size(),
                                                   " buffers and ", streams.size(), " streams for ",
                                                   devices_.size(), " ranks"));
  }
  if (dtype != numeric::DType::kF32 && dtype != numeric::DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclGroup::AllReduceSum: dtype ", numeric::DTypeName(dtype), " (want f32 or bf16)"));
  }
  for (size_t r = 0; r < buffers.size(); ++r) {
    if (buffers[r] == nullptr && count > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("NcclGroup::AllReduceSum: rank ", r, "'s buffer is null"));
    }
  }
  if (count == 0) return absl::OkStatus();
  const ncclDataType_t type = dtype == numeric::DType::kF32 ? ncclFloat32 : ncclBfloat16;
  ncclResult_t result = ncclGroupStart();
  if (result != ncclSuccess) return NcclError("group start", result);
  ncclResult_t first_error = ncclSuccess;
  for (size_t r = 0; r < buffers.size(); ++r) {
    result =
        ncclAllReduce(buffers[r], buffers[r], count, type, ncclSum, comms_->comms[r], streams[r]);
    if (result != ncclSuccess && first_error == ncclSuccess) first_error = result;
  }
  result = ncclGroupEnd();
  if (first_error != ncclSuccess) return NcclError("all-reduce", first_error);
  if (result != ncclSuccess) return NcclError("group end", result);
  return absl::OkStatus();
}

}  // namespace trident::parallel
