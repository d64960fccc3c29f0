# Installs headers and libraries and exports pmapcc::{pmapcc,runtime,kernels,core,nn,optim,train,io} (and ::onnx) for
# find_package(pmapcc CONFIG).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(pmapcc_runtime PROPERTIES EXPORT_NAME runtime)
set_target_properties(pmapcc_kernels PROPERTIES EXPORT_NAME kernels)
set_target_properties(pmapcc_core PROPERTIES EXPORT_NAME core)
set_target_properties(pmapcc_nn PROPERTIES EXPORT_NAME nn)
set_target_properties(pmapcc_optim PROPERTIES EXPORT_NAME optim)
set_target_properties(pmapcc_train PROPERTIES EXPORT_NAME train)
set_target_properties(pmapcc_io PROPERTIES EXPORT_NAME io)

install(TARGETS pmapcc pmapcc_runtime pmapcc_kernels pmapcc_core pmapcc_nn pmapcc_optim pmapcc_train pmapcc_io
        EXPORT pmapccTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})  # include paths: each target's $<INSTALL_INTERFACE:...>
if(PMAPCC_HAVE_ONNX)  # pmapcc::onnx, the exporter, where it was built
  set_target_properties(pmapcc_onnx PROPERTIES EXPORT_NAME onnx)
  install(TARGETS pmapcc_onnx EXPORT pmapccTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(DIRECTORY include/pmap DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY kernels core nn optim train io export DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pmapcc  # <pmapcc/kernels/...>
        FILES_MATCHING PATTERN "*.h" PATTERN "*.def"
        PATTERN "cpu" EXCLUDE PATTERN "cuda" EXCLUDE PATTERN "array_ops_checks.h" EXCLUDE)  # internal headers
install(EXPORT pmapccTargets NAMESPACE pmapcc:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/pmapcc)

# Where the CUDA toolkit was found (the directory above nvcc's bin/), a hint for the installed config.
set(PMAPCC_CUDA_TOOLKIT_ROOT "")
if(PMAPCC_HAVE_CUDA AND CUDAToolkit_BIN_DIR)
  get_filename_component(PMAPCC_CUDA_TOOLKIT_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
endif()

configure_package_config_file(cmake/pmapccConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/pmapccConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/pmapcc)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/pmapccConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/pmapccConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/pmapccConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/pmapcc)
