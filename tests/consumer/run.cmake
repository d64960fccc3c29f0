# The consumer-project check: installs a pmapcc build tree into a fresh prefix, then configures, builds and runs
# tests/consumer (everything) and tests/consumer/runtime_only (the runtime alone) against it with only
# CMAKE_PREFIX_PATH pointing there. Used by CTest (consumer_project):
#   cmake -DBUILD_DIR=<pmapcc build> -DWORK_DIR=<scratch> [-DGENERATOR=..] [-DBUILD_TYPE=..] [-DCXX_COMPILER=..]
#         [-DSANITIZE=address|undefined|thread] -P tests/consumer/run.cmake
cmake_minimum_required(VERSION 3.24)
foreach(var BUILD_DIR WORK_DIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run.cmake: -D${var}=... is required")
  endif()
endforeach()

set(consumer_src "${CMAKE_CURRENT_LIST_DIR}")
set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")

# step(NAME COMMAND...): runs the command; on failure prints its output and stops. Output in step_output.
function(step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer check: ${name} failed (exit ${rc}):\n${out}")
  endif()
  message(STATUS "consumer check: ${name}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

step("install ${BUILD_DIR} into ${prefix}" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")

# The programs are installed with the package (when the build has them) and run from there.
if(EXISTS "${BUILD_DIR}/examples/pmap_info")
  foreach(program pmap_info mnist_ensemble)
    if(NOT EXISTS "${prefix}/bin/${program}")
      message(FATAL_ERROR "consumer check: ${program} was not installed into ${prefix}/bin")
    endif()
  endforeach()
  step("run the installed pmap_info" "${prefix}/bin/pmap_info")
  step("run the installed mnist_ensemble --help" "${prefix}/bin/mnist_ensemble" --help)
endif()

set(args "-DCMAKE_PREFIX_PATH=${prefix}")
if(GENERATOR)
  list(APPEND args -G "${GENERATOR}")
endif()
if(BUILD_TYPE)
  list(APPEND args "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
endif()
if(CXX_COMPILER)
  list(APPEND args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(SANITIZE)  # the installed static libraries are instrumented: the program must link the same runtime
  list(APPEND args "-DCMAKE_CXX_FLAGS=-fsanitize=${SANITIZE}" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE}")
endif()
# Eigen is used inside the kernels only: no consumer may need it.
step("configure the consumer" "${CMAKE_COMMAND}" -S "${consumer_src}" -B "${build}" ${args}
     -DCMAKE_DISABLE_FIND_PACKAGE_Eigen3=TRUE)

# The package must have come from our prefix, not from some other pmapcc on the system.
file(STRINGS "${build}/CMakeCache.txt" found_dir REGEX "^pmapcc_DIR:")
string(FIND "${found_dir}" "${prefix}/" at)
if(NOT at GREATER -1)
  message(FATAL_ERROR "consumer check: find_package(pmapcc) found '${found_dir}', not the package in ${prefix}")
endif()

step("build the consumer" "${CMAKE_COMMAND}" --build "${build}")
step("run the consumer" "${build}/consumer")
message("${step_output}")

# A consumer of the runtime alone needs neither zlib, nlohmann-json nor Eigen (all hidden from it) nor the C
# language.
step("configure the runtime-only consumer" "${CMAKE_COMMAND}" -S "${consumer_src}/runtime_only" -B "${build}-runtime"
     ${args} -DCMAKE_DISABLE_FIND_PACKAGE_ZLIB=TRUE -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=TRUE
     -DCMAKE_DISABLE_FIND_PACKAGE_Eigen3=TRUE)
step("build the runtime-only consumer" "${CMAKE_COMMAND}" --build "${build}-runtime")
step("run the runtime-only consumer" "${build}-runtime/runtime_consumer")
message("${step_output}")
