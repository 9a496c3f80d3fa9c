# memforensics_portable: the memforensics executable for a machine that has none of its build
# dependencies (the lent GPU machine of scripts/gpu-check.sh: no libzstd-dev, maybe another
# libstdc++). Same sources and libraries as src/cli's memforensics, linked with libstdc++ and
# libgcc statically (-static-libstdc++ -static-libgcc), libzstd.a (MEMF_STATIC_ZSTD, see
# cmake/MemfZstd.cmake) and libz.a (MEMF_STATIC_ZLIB, src/format/CMakeLists.txt), without debug information, so that it needs only glibc (libc, libm) and
# is small enough to travel with the working tree. CLI11, nlohmann_json and Boost.Graph are header
# only. Not built by default:
#
#   cmake --build build --target memforensics_portable   # -> build/portable/memforensics-portable
#
# The static libraries are the ones the normal build made (no second compilation of the project);
# only src/cli's sources are compiled again. `record` looks for libmemforensics_cupti.so as the
# normal executable does ($MEMFORENSICS_CUPTI_LIB first).
get_target_property(memf_cli_sources memforensics SOURCES)
get_target_property(memf_cli_dir memforensics SOURCE_DIR)
list(TRANSFORM memf_cli_sources PREPEND ${memf_cli_dir}/)
add_executable(memforensics_portable EXCLUDE_FROM_ALL ${memf_cli_sources})
foreach(prop LINK_LIBRARIES INCLUDE_DIRECTORIES COMPILE_DEFINITIONS COMPILE_OPTIONS)
  get_target_property(v memforensics ${prop})
  if(v)
    set_property(TARGET memforensics_portable PROPERTY ${prop} "${v}")
  endif()
endforeach()
set_target_properties(memforensics_portable PROPERTIES
  OUTPUT_NAME memforensics-portable RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/portable MEMF_STATIC_ZSTD ON
  MEMF_STATIC_ZLIB ON)
target_link_options(memforensics_portable PRIVATE -static-libstdc++ -static-libgcc "LINKER:--strip-debug")
if(NOT MEMF_ZSTD_STATIC_LIBRARY)
  message(STATUS "memforensics: no libzstd.a: memforensics_portable links libzstd.so")
endif()
