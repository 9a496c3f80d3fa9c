# memf_zstd: libzstd for the native trace writer and reader (src/format/trace/trace_writer.cc,
# trace_reader.cc), as one INTERFACE target visible in every directory (an IMPORTED target from
# pkg_check_modules is directory-scoped, which is why src/capture used to look for zstd again).
#
#   MEMF_HAVE_ZSTD   ON when zstd.h and libzstd were found. The target then carries
#                    MEMF_HAVE_ZSTD=1; otherwise MEMF_HAVE_ZSTD=0, and the writer stores every
#                    chunk uncompressed (Codec::None) and the reader refuses zstd chunks with a
#                    message. Without the define the sources assume zstd.
#   -DCMAKE_DISABLE_FIND_PACKAGE_zstd=ON   do not look (as for the find_package() dependencies).
#
# Static linking on request, per consumer: a target whose property MEMF_STATIC_ZSTD is ON links
# libzstd.a instead of libzstd.so (the head target's property is read at generation time, so the
# static libraries that use zstd stay the same; see memforensics_portable in cmake/MemfPortableCli.cmake).
#
# zstd is optional only for MEMF_CAPTURE_ONLY builds; the full build requires it (the reader must
# read every file the tools write).
if(TARGET memf_zstd)
  return()
endif()
add_library(memf_zstd INTERFACE)
set(MEMF_HAVE_ZSTD OFF)
if(NOT CMAKE_DISABLE_FIND_PACKAGE_zstd)
  # pkg-config only as a hint: the GPU machine (scripts/gpu-check.sh) may have no pkg-config.
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(PC_MEMF_ZSTD QUIET libzstd)
  endif()
  find_path(MEMF_ZSTD_INCLUDE_DIR zstd.h HINTS ${PC_MEMF_ZSTD_INCLUDE_DIRS})
  find_library(MEMF_ZSTD_LIBRARY NAMES zstd HINTS ${PC_MEMF_ZSTD_LIBRARY_DIRS})
  find_library(MEMF_ZSTD_STATIC_LIBRARY NAMES libzstd.a HINTS ${PC_MEMF_ZSTD_LIBRARY_DIRS})
  mark_as_advanced(MEMF_ZSTD_INCLUDE_DIR MEMF_ZSTD_LIBRARY MEMF_ZSTD_STATIC_LIBRARY)
  if(MEMF_ZSTD_INCLUDE_DIR AND MEMF_ZSTD_LIBRARY)
    set(MEMF_HAVE_ZSTD ON)
  endif()
endif()
if(MEMF_HAVE_ZSTD)
  target_include_directories(memf_zstd SYSTEM INTERFACE ${MEMF_ZSTD_INCLUDE_DIR})
  target_compile_definitions(memf_zstd INTERFACE MEMF_HAVE_ZSTD=1)
  if(MEMF_ZSTD_STATIC_LIBRARY)
    target_link_libraries(memf_zstd INTERFACE
      "$<IF:$<BOOL:$<TARGET_PROPERTY:MEMF_STATIC_ZSTD>>,${MEMF_ZSTD_STATIC_LIBRARY},${MEMF_ZSTD_LIBRARY}>")
  else()
    target_link_libraries(memf_zstd INTERFACE ${MEMF_ZSTD_LIBRARY})
  endif()
  message(STATUS "memforensics: zstd ${MEMF_ZSTD_LIBRARY} (static: ${MEMF_ZSTD_STATIC_LIBRARY})")
else()
  target_compile_definitions(memf_zstd INTERFACE MEMF_HAVE_ZSTD=0)
  message(STATUS "memforensics: no zstd: native traces are written with stored (uncompressed) chunks")
endif()
add_feature_info(zstd MEMF_HAVE_ZSTD "zstd-compressed chunks in native traces (Debian: libzstd-dev)")
