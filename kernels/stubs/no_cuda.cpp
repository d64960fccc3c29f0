// Stub CUDA kernels for builds without the CUDA toolkit.
namespace pmap::kernels::detail {
bool cuda_kernels_built() { return false; }
}  // namespace pmap::kernels::detail
