# The CPU kernels (kernels/cpu/*.cpp) built once per ISA variant, so one binary runs anywhere and uses
# AVX2+FMA where the CPU has them.
#
# Two builds of the same Eigen code in one program break the one-definition rule: every inline function
# and template (Eigen's, and the standard library's) is emitted in both, the linker keeps one copy, and the
# generic path could end up calling an AVX2 copy. So each variant is compiled into its own namespace
# (-DPMAPCC_CPU_VARIANT=<name>: pmap::kernels::cpu::<name>), the avx2 one with Eigen renamed
# (-DEigen=pmapcc_eigen_avx2), and the avx2 objects are then linked into one relocatable object
# (ld -r --force-group-allocation, which resolves and dissolves the COMDAT groups) whose symbols objcopy makes
# local except its entry point pmapcc_cpu_backend_avx2 (that variant's CpuBackend). Nothing compiled with
# -mavx2 is visible to the rest of the program; scripts/check_cpu_variants.sh verifies it with nm.
#
# PMAPCC_CPU_AVX2 (AUTO|ON|OFF): AUTO builds the avx2 variant on x86-64 with GCC or Clang and GNU ld/objcopy.

set(PMAPCC_CPU_AVX2 AUTO CACHE STRING "Build the AVX2+FMA variant of the CPU kernels (AUTO|ON|OFF)")
set_property(CACHE PMAPCC_CPU_AVX2 PROPERTY STRINGS AUTO ON OFF)

set(PMAPCC_HAVE_CPU_AVX2 OFF)
if(NOT PMAPCC_CPU_AVX2 STREQUAL "OFF")
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag("-mavx2 -mfma" PMAPCC_CXX_HAS_MAVX2)
  check_cxx_compiler_flag("-fno-gnu-unique" PMAPCC_CXX_HAS_NO_GNU_UNIQUE)
  set(_why "")
  if(NOT CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    set(_why "not an x86-64 target (${CMAKE_SYSTEM_PROCESSOR})")
  elseif(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" OR NOT PMAPCC_CXX_HAS_MAVX2)
    set(_why "the compiler does not take -mavx2 -mfma")
  elseif(NOT CMAKE_LINKER OR NOT CMAKE_OBJCOPY)
    set(_why "no ld / objcopy found")
  else()
    execute_process(COMMAND ${CMAKE_LINKER} --help OUTPUT_VARIABLE _ld_help ERROR_QUIET)
    if(NOT _ld_help MATCHES "--force-group-allocation")
      set(_why "${CMAKE_LINKER} lacks --force-group-allocation (GNU binutils >= 2.29 needed)")
    endif()
  endif()
  if(_why STREQUAL "")
    set(PMAPCC_HAVE_CPU_AVX2 ON)
  elseif(PMAPCC_CPU_AVX2 STREQUAL "ON")
    message(FATAL_ERROR "PMAPCC_CPU_AVX2=ON but the avx2 CPU kernels cannot be built: ${_why}")
  else()
    set(PMAPCC_CPU_AVX2_WHY_NOT "${_why}")
  endif()
endif()

# pmapcc_cpu_variant(<name> <compile flags> <out var>): compiles kernel_cpu_sources as variant <name> and
# sets <out var> to what pmapcc_kernels links in (the objects, or for avx2 the one localized object).
function(pmapcc_cpu_variant name flags out_var)
  set(lib pmapcc_kernels_cpu_${name})
  add_library(${lib} OBJECT ${kernel_cpu_sources})
  target_include_directories(${lib} PRIVATE ${PMAPCC_BUILD_INCLUDE_DIR})
  target_link_libraries(${lib} PRIVATE pmapcc_runtime Eigen3::Eigen)
  target_compile_definitions(${lib} PRIVATE PMAPCC_CPU_VARIANT=${name})
  # No contraction of a * b + c into FMA outside Eigen's explicit kernels: element-wise ops (SGD, relu,
  # pooling) then round the same in every variant, as the optimizer's bitwise test expects.
  target_compile_options(${lib} PRIVATE ${flags} $<$<CXX_COMPILER_ID:GNU,Clang>:-ffp-contract=off>)
  pmapcc_warnings(${lib})
  if(name STREQUAL "generic")
    set(${out_var} $<TARGET_OBJECTS:${lib}> PARENT_SCOPE)
    return()
  endif()
  target_compile_definitions(${lib} PRIVATE Eigen=pmapcc_eigen_${name})
  if(PMAPCC_CXX_HAS_NO_GNU_UNIQUE)  # GCC: static locals of inline functions as weak, not STB_GNU_UNIQUE,
    target_compile_options(${lib} PRIVATE -fno-gnu-unique)  # so that objcopy can make them local too
  endif()
  set(merged ${CMAKE_CURRENT_BINARY_DIR}/pmapcc_kernels_cpu_${name}.merged.o)
  set(blob ${CMAKE_CURRENT_BINARY_DIR}/pmapcc_kernels_cpu_${name}.o)
  add_custom_command(
    OUTPUT ${blob}
    COMMAND ${CMAKE_LINKER} -r --force-group-allocation -o ${merged} $<TARGET_OBJECTS:${lib}>
    COMMAND ${CMAKE_OBJCOPY} --keep-global-symbol=pmapcc_cpu_backend_${name} ${merged} ${blob}
    DEPENDS ${lib} $<TARGET_OBJECTS:${lib}>
    COMMAND_EXPAND_LISTS
    COMMENT "Linking the ${name} CPU kernels into one object with a single global symbol"
    VERBATIM)
  set_source_files_properties(${blob} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
  set(${out_var} ${blob} PARENT_SCOPE)
endfunction()
