# Finds what pmapcc builds against and decides which optional backends are on.
find_package(Threads REQUIRED)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
find_package(ZLIB REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)

# CUDA: AUTO turns it on when a CUDA compiler and toolkit are found. PMAPCC_CUDA_STANDIN instead builds the
# CUDA backend's sources as C++ against the toolkit's headers and links them with pmapcc's CPU stand-in
# for the CUDA runtime, cuBLAS and NCCL (tests/standin): a test-only build with fake GPUs and no nvcc.
option(PMAPCC_CUDA_STANDIN "Build the CUDA backend against the CPU stand-in of tests/standin (test-only)" OFF)
set(PMAPCC_HAVE_CUDA OFF)
if(PMAPCC_CUDA_STANDIN)
  find_package(CUDAToolkit REQUIRED)  # its headers only
  set(PMAPCC_HAVE_CUDA ON)
elseif(NOT PMAPCC_WITH_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures (90: H100/H200)")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
  endif()
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    set(PMAPCC_HAVE_CUDA ON)
  elseif(PMAPCC_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "PMAPCC_WITH_CUDA=ON but no CUDA compiler/toolkit was found "
                        "(looked for nvcc on PATH and at /usr/local/cuda/bin/nvcc)")
  endif()
endif()
if(PMAPCC_HAVE_CUDA AND NOT PMAPCC_CUDA_STANDIN)
  # CMake 3.25 does not know that nvcc 13 speaks C++20: teach it the flag.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  # One CUDA runtime per process: .cu targets link the shared cudart, as CUDA::cudart does (a static
  # copy beside it would be a second runtime whose streams the first does not know).
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
endif()

# NCCL: only meaningful with CUDA.
set(PMAPCC_HAVE_NCCL OFF)
if(PMAPCC_HAVE_CUDA AND PMAPCC_CUDA_STANDIN AND NOT PMAPCC_WITH_NCCL STREQUAL "OFF")
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)  # the stand-in's
  if(NCCL_INCLUDE_DIR)
    set(PMAPCC_HAVE_NCCL ON)
  endif()
elseif(PMAPCC_HAVE_CUDA AND NOT PMAPCC_WITH_NCCL STREQUAL "OFF")
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(PMAPCC_HAVE_NCCL ON)
  endif()
endif()
if(PMAPCC_WITH_NCCL STREQUAL "ON" AND NOT PMAPCC_HAVE_NCCL)
  message(FATAL_ERROR "PMAPCC_WITH_NCCL=ON but NCCL (nccl.h, libnccl) was not found or CUDA is off")
endif()

# MPI: multi-process meshes. The runtime calls MPI's C API from C++: the CXX component without the
# (removed) C++ bindings, so neither pmapcc nor a program using it has to enable the C language.
set(PMAPCC_HAVE_MPI OFF)
if(NOT PMAPCC_WITH_MPI STREQUAL "OFF")
  set(MPI_CXX_SKIP_MPICXX TRUE)
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(PMAPCC_HAVE_MPI ON)
  elseif(PMAPCC_WITH_MPI STREQUAL "ON")
    message(FATAL_ERROR "PMAPCC_WITH_MPI=ON but no MPI was found (install libopenmpi-dev: scripts/setup.sh)")
  endif()
endif()

# ONNX export: the ONNX protobuf classes (libonnx-dev) and Protobuf (libprotobuf-dev).
set(PMAPCC_HAVE_ONNX OFF)
if(NOT PMAPCC_WITH_ONNX STREQUAL "OFF")
  find_package(Protobuf QUIET)
  if(Protobuf_FOUND)
    find_package(ONNX QUIET)
  endif()
  if(Protobuf_FOUND AND ONNX_FOUND AND TARGET onnx_proto)
    set(PMAPCC_HAVE_ONNX ON)
  elseif(PMAPCC_WITH_ONNX STREQUAL "ON")
    message(FATAL_ERROR "PMAPCC_WITH_ONNX=ON but ONNX or Protobuf was not found "
                        "(install libonnx-dev and libprotobuf-dev: scripts/setup.sh)")
  endif()
endif()

# cuRAND's host library is used by the tests to check our Philox stream even without a GPU.
set(PMAPCC_HAVE_CURAND_HOST OFF)
if(PMAPCC_HAVE_CUDA AND TARGET CUDA::curand)
  set(PMAPCC_HAVE_CURAND_HOST ON)
endif()

# Sanitizers apply to everything built below.
if(PMAPCC_SANITIZE)
  if(NOT PMAPCC_SANITIZE MATCHES "^(address|undefined|thread|address,undefined)$")
    message(FATAL_ERROR "PMAPCC_SANITIZE must be address, undefined, address,undefined or thread "
                        "(got '${PMAPCC_SANITIZE}')")
  endif()
  set(_san -fsanitize=${PMAPCC_SANITIZE} -fno-omit-frame-pointer)
  if(PMAPCC_SANITIZE MATCHES "undefined")
    list(APPEND _san -fno-sanitize-recover=undefined)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      # GCC 12's UBSan instrumentation makes -Wmaybe-uninitialized fire inside libstdc++'s <regex> (std::function
      # moves in its NFA builder; the program's --layout), a false positive the uninstrumented builds do not show.
      add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-maybe-uninitialized>)
    endif()
  endif()
  foreach(flag IN LISTS _san)
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:${flag}>)
  endforeach()
  add_link_options(${_san})
endif()

# The fuzz build: libFuzzer's coverage instrumentation, ASan and UBSan on everything; the fuzz targets
# (tests/fuzz) link libFuzzer's main. Clang only (GCC has no libFuzzer).
if(PMAPCC_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "PMAPCC_BUILD_FUZZERS needs clang (libFuzzer), not ${CMAKE_CXX_COMPILER_ID}: "
                        "cmake --preset fuzz (scripts/setup.sh --fuzz installs clang)")
  endif()
  if(PMAPCC_SANITIZE)
    message(FATAL_ERROR "PMAPCC_BUILD_FUZZERS builds with ASan and UBSan itself: leave PMAPCC_SANITIZE empty")
  endif()
  foreach(flag -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:${flag}>)
  endforeach()
  add_link_options(-fsanitize=address,undefined)
endif()

# The CPU kernels' ISA variants (AVX2+FMA next to the baseline build).
include(${CMAKE_CURRENT_LIST_DIR}/pmapccCpuVariants.cmake)
