# One place for warning flags; every pmapcc target calls pmapcc_warnings().
# GCC 12 reports -Wrestrict for `"literal" + std::string&&` at -O2+ (GCC bug 105651, fixed in 13):
# that single false positive is turned off there.
set(PMAPCC_GCC12_NO_RESTRICT "")
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  set(PMAPCC_GCC12_NO_RESTRICT -Wno-restrict)
endif()
function(pmapcc_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor ${PMAPCC_GCC12_NO_RESTRICT}>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --Werror cross-execution-space-call>)
endfunction()
