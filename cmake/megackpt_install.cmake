# `cmake --install`: headers, the static libraries, a CMake package
# (find_package(megackpt) -> megackpt::megackpt and megackpt::<layer>) and
# megackpt.pc. Included from the top-level CMakeLists.txt when MEGACKPT_INSTALL.
include(CMakePackageConfigHelpers)

set(MEGACKPT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/megackpt CACHE STRING
    "Where megackptConfig.cmake is installed (relative to the prefix)")

get_property(megackpt_layers GLOBAL PROPERTY MEGACKPT_LAYERS)
install(TARGETS ${megackpt_layers} megackpt EXPORT megackptTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# Public headers of the layers that were built (plus the umbrella and config.h).
set(megackpt_header_excludes)
if(NOT MEGACKPT_WITH_CAS)
  list(APPEND megackpt_header_excludes PATTERN "cas" EXCLUDE)
endif()
if(NOT MEGACKPT_WITH_HUB)
  list(APPEND megackpt_header_excludes PATTERN "hub" EXCLUDE)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/megackpt DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" ${megackpt_header_excludes})
install(FILES ${PROJECT_BINARY_DIR}/include/megackpt/config.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/megackpt)

install(EXPORT megackptTargets NAMESPACE megackpt:: DESTINATION ${MEGACKPT_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/megackptConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/megackptConfig.cmake
                              INSTALL_DESTINATION ${MEGACKPT_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/megackptConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/megackptConfig.cmake ${PROJECT_BINARY_DIR}/megackptConfigVersion.cmake
        DESTINATION ${MEGACKPT_INSTALL_CMAKEDIR})

# pkg-config: static libraries, so every dependency goes in Requires/Libs.
set(MEGACKPT_PC_REQUIRES "libcrypto libisal libzstd zlib nlohmann_json")
set(MEGACKPT_PC_LIBS "-lmegackpt_dcp -lmegackpt_dist")
set(MEGACKPT_PC_LINK_FLAGS "")
set(MEGACKPT_PC_CFLAGS "")
if(MEGACKPT_WITH_HUB)
  string(APPEND MEGACKPT_PC_REQUIRES " sqlite3 libmicrohttpd libcurl")
  string(APPEND MEGACKPT_PC_LIBS " -lmegackpt_hub")
  set(MEGACKPT_PC_LINK_FLAGS "-Wl,--undefined=megackpt_hub_mega_scheme_registered ")
endif()
if(MEGACKPT_WITH_CAS)
  string(APPEND MEGACKPT_PC_REQUIRES " liblz4")
  string(APPEND MEGACKPT_PC_LIBS " -lmegackpt_cas")
endif()
string(APPEND MEGACKPT_PC_LIBS " -lmegackpt_format -lmegackpt_fs -lmegackpt_core -pthread")
if(MEGACKPT_WITH_MPI)
  string(APPEND MEGACKPT_PC_REQUIRES " ompi-c")
  set(MEGACKPT_PC_CFLAGS " -DOMPI_SKIP_MPICXX=1 -DMPICH_SKIP_MPICXX=1")
endif()
file(RELATIVE_PATH MEGACKPT_PC_RELATIVE_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" MEGACKPT_PC_RELATIVE_PREFIX "${MEGACKPT_PC_RELATIVE_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/megackpt.pc.in ${PROJECT_BINARY_DIR}/megackpt.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/megackpt.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
