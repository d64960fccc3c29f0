// pmapcc's error hierarchy: every error the library raises derives from pmap::Error.
// Errors raised on a device carry that device (set by pmap when it rethrows them on the host).
#pragma once

#include <stdexcept>
#include <string>

namespace pmap {

// Base of every pmapcc error. what() is the full message, including the device when one is attached.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message), message_(message) {}
  const char* what() const noexcept override { return full_.empty() ? message_.c_str() : full_.c_str(); }
  // The message without the device prefix.
  const std::string& message() const noexcept { return message_; }
  // The device the error was raised on ("cpu:2"), or "" when raised on the host.
  const std::string& device() const noexcept { return device_; }
  // Attaches the device; what() becomes "cpu:2: <message>". Used by pmap; idempotent.
  void set_device(const std::string& device) {
    if (!device_.empty()) return;
    device_ = device;
    full_ = device + ": " + message_;
  }

 private:
  std::string message_;
  std::string device_;
  std::string full_;
};

#define PMAPCC_DEFINE_ERROR(Name, Base)                      \
  class Name : public Base {                                 \
   public:                                                   \
    explicit Name(const std::string& m) : Base(m) {}         \
  };

PMAPCC_DEFINE_ERROR(ShapeError, Error)        // shapes, sizes or dtypes that do not fit
PMAPCC_DEFINE_ERROR(ValueError, Error)        // an argument with a bad value (negative count, bad option)
PMAPCC_DEFINE_ERROR(AxisError, Error)         // an axis name not in scope
PMAPCC_DEFINE_ERROR(CollectiveMismatch, Error) // devices called different collectives at the same point
PMAPCC_DEFINE_ERROR(Aborted, Error)           // a collective was cancelled because another device failed
PMAPCC_DEFINE_ERROR(Timeout, Error)           // a collective waited longer than the mesh's timeout
PMAPCC_DEFINE_ERROR(NotAvailable, Error)      // a backend that was not built or has no device here
PMAPCC_DEFINE_ERROR(DataError, Error)         // a data or checkpoint file that is missing or malformed
PMAPCC_DEFINE_ERROR(IoError, Error)           // reading or writing a file failed
PMAPCC_DEFINE_ERROR(CudaError, Error)         // a CUDA runtime / driver call failed
PMAPCC_DEFINE_ERROR(CublasError, CudaError)   // a cuBLAS call failed
PMAPCC_DEFINE_ERROR(CurandError, CudaError)   // a cuRAND call failed
PMAPCC_DEFINE_ERROR(NcclError, Error)         // an NCCL call failed
PMAPCC_DEFINE_ERROR(MpiError, Error)          // an MPI call failed or a process was lost
PMAPCC_DEFINE_ERROR(CaptureError, Error)      // a step being captured into a graph allocated, synchronized
                                              // with the host or called a collective

#undef PMAPCC_DEFINE_ERROR

// A non-pmapcc exception (std::exception or other) thrown by user code on a device, rethrown by pmap.
// message() is the original what().
class DeviceError : public Error {
 public:
  explicit DeviceError(const std::string& m) : Error(m) {}
};

}  // namespace pmap
