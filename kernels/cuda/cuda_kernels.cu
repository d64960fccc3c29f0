// CUDA kernels presence flag.
namespace pmap::kernels::detail {
bool cuda_kernels_built() { return true; }
}  // namespace pmap::kernels::detail
