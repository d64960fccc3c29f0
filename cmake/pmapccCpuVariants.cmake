# The CPU kernels (kernels/cpu/*.cpp) built once per ISA variant, so one binary runs anywhere and uses
# AVX2+FMA or AVX-512 where the CPU has them.
#
# Two builds of the same Eigen code in one program break the one-definition rule: every inline function
# and template (Eigen's, and the standard library's) is emitted in both, the linker keeps one copy, and the
# generic path could end up calling an AVX2 copy. So each variant is compiled into its own namespace
# (-DPMAPCC_CPU_VARIANT=<name>: pmap::kernels::cpu::<name>), the avx2 one with Eigen renamed
# (-DEigen=pmapcc_eigen_avx2), and the avx2 objects are then linked into one relocatable object
# (ld -r --force-group-allocation, which resolves and dissolves the COMDAT groups) whose symbols objcopy makes
# local except its entry point pmapcc_cpu_backend_avx2 (that variant's CpuBackend). Nothing compiled with
# -mavx2 is visible to the rest of the program; scripts/check_cpu_variants.sh verifies it with nm. The avx512
# variant is built the same way (pmapcc_eigen_avx512, pmapcc_cpu_backend_avx512).
#
# PMAPCC_CPU_AVX2 and PMAPCC_CPU_AVX512 (AUTO|ON|OFF): AUTO builds that variant on x86-64 with GCC or Clang
# and GNU ld/objcopy when the compiler takes its flags. The avx512 variant is AVX-512 F/BW/DQ/VL with FMA
# (x86-64-v4), vectorized 512 bits wide.
set(PMAPCC_CPU_AVX2_FLAGS -mavx2 -mfma)
set(PMAPCC_CPU_AVX512_FLAGS -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma -mprefer-vector-width=512)

# _pmapcc_cpu_variant_option(<NAME> <description>): the cache option PMAPCC_CPU_<NAME>, and
# PMAPCC_HAVE_CPU_<NAME> (ON when the variant is built) or PMAPCC_CPU_<NAME>_WHY_NOT.
function(_pmapcc_cpu_variant_option NAME description)
  set(PMAPCC_CPU_${NAME} AUTO CACHE STRING "Build the ${description} variant of the CPU kernels (AUTO|ON|OFF)")
  set_property(CACHE PMAPCC_CPU_${NAME} PROPERTY STRINGS AUTO ON OFF)
  set(have OFF)
  set(why "")
  if(NOT PMAPCC_CPU_${NAME} STREQUAL "OFF")
    string(REPLACE ";" " " flags "${PMAPCC_CPU_${NAME}_FLAGS}")
    check_cxx_compiler_flag("${flags}" PMAPCC_CXX_HAS_${NAME}_FLAGS)
    if(NOT CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
      set(why "not an x86-64 target (${CMAKE_SYSTEM_PROCESSOR})")
    elseif(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" OR NOT PMAPCC_CXX_HAS_${NAME}_FLAGS)
      set(why "the compiler does not take ${flags}")
    elseif(NOT CMAKE_LINKER OR NOT CMAKE_OBJCOPY)
      set(why "no ld / objcopy found")
    else()
      execute_process(COMMAND ${CMAKE_LINKER} --help OUTPUT_VARIABLE ld_help ERROR_QUIET)
      if(NOT ld_help MATCHES "--force-group-allocation")
        set(why "${CMAKE_LINKER} lacks --force-group-allocation (GNU binutils >= 2.29 needed)")
      endif()
    endif()
    if(why STREQUAL "")
      set(have ON)
    elseif(PMAPCC_CPU_${NAME} STREQUAL "ON")
      message(FATAL_ERROR "PMAPCC_CPU_${NAME}=ON but the ${description} CPU kernels cannot be built: ${why}")
    endif()
  endif()
  set(PMAPCC_HAVE_CPU_${NAME} ${have} PARENT_SCOPE)
  set(PMAPCC_CPU_${NAME}_WHY_NOT "${why}" PARENT_SCOPE)
endfunction()

include(CheckCXXCompilerFlag)
check_cxx_compiler_flag("-fno-gnu-unique" PMAPCC_CXX_HAS_NO_GNU_UNIQUE)
_pmapcc_cpu_variant_option(AVX2 "AVX2+FMA")
_pmapcc_cpu_variant_option(AVX512 "AVX-512 (F/BW/DQ/VL)+FMA")

# pmapcc_cpu_variant(<name> <compile flags> <out var>): compiles kernel_cpu_sources as variant <name> and
# sets <out var> to what pmapcc_kernels links in (the objects, or for avx2 and avx512 the one localized object).
function(pmapcc_cpu_variant name flags out_var)
  set(lib pmapcc_kernels_cpu_${name})
  add_library(${lib} OBJECT ${kernel_cpu_sources})
  target_include_directories(${lib} PRIVATE ${PMAPCC_BUILD_INCLUDE_DIR})
  target_link_libraries(${lib} PRIVATE pmapcc_runtime Eigen3::Eigen)
  target_compile_definitions(${lib} PRIVATE PMAPCC_CPU_VARIANT=${name})
  # No contraction of a * b + c into FMA outside Eigen's explicit kernels: element-wise ops (SGD, relu,
  # pooling) then round the same in every variant, as the optimizer's bitwise test expects.
  target_compile_options(${lib} PRIVATE ${flags} $<$<CXX_COMPILER_ID:GNU,Clang>:-ffp-contract=off>)
  # GCC's -O2 vectorizes only loops that need no scalar epilogue or alias check (its "very cheap" cost
  # model), which left the element-wise and per-channel loops here (batch norm, relu, col2im) scalar; the
  # dynamic model vectorizes them as -O3 would. The bits stay the same: element-wise IEEE arithmetic gives
  # the same result in a vector lane, and GCC reorders no float sum without -fassociative-math.
  target_compile_options(${lib} PRIVATE $<$<CXX_COMPILER_ID:GNU>:-fvect-cost-model=dynamic>)
  pmapcc_warnings(${lib})
  # GCC 12's own AVX-512 headers pass `__m512 __Y = __Y` as the unused merge operand of their intrinsics, which
  # its -W(maybe-)uninitialized then reports where Eigen inlines them (GCC bug 105593, fixed in GCC 13).
  if(name STREQUAL "avx512" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${lib} PRIVATE -Wno-maybe-uninitialized -Wno-uninitialized)
  endif()
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
