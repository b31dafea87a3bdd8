# The third-party packages each layer needs (all from Debian's archive:
# scripts/install-deps.sh), looked for only when that layer is built.
#   core    Threads, OpenSSL::Crypto (SHA-256), ISA-L (CRC-32), dlpack (header)
#   fs      core only
#   format  zstd, nlohmann_json
#   cas     LZ4, BLAKE3 (C sources from librust-blake3-dev, compiled in)
#   hub     SQLite3, libmicrohttpd, libcurl, OpenSSL::Crypto, nlohmann_json
#   dist    MPI (only with MEGACKPT_WITH_MPI)
#   dcp     zlib (crc32_combine), nlohmann_json
#   tools   CLI11
# Imported targets from pkg-config are prefixed MEGACKPT_ so they never clash
# with a parent project's.
find_package(Threads REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(ZLIB REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(MEGACKPT_ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(MEGACKPT_ISAL REQUIRED IMPORTED_TARGET libisal)
find_path(DLPACK_INCLUDE_DIR dlpack/dlpack.h REQUIRED)

if(MEGACKPT_WITH_CAS)
  pkg_check_modules(MEGACKPT_LZ4 REQUIRED IMPORTED_TARGET liblz4)
  file(GLOB BLAKE3_C_DIR LIST_DIRECTORIES true /usr/share/cargo/registry/blake3-*/c)
  if(NOT BLAKE3_C_DIR)
    message(FATAL_ERROR "BLAKE3 C sources not found: install librust-blake3-dev "
                        "(or configure with -DMEGACKPT_WITH_CAS=OFF -DMEGACKPT_WITH_HUB=OFF)")
  endif()
  list(GET BLAKE3_C_DIR 0 BLAKE3_C_DIR)
endif()

if(MEGACKPT_WITH_HUB)
  find_package(SQLite3 REQUIRED)
  # HTTP: libmicrohttpd serves megahub, libcurl is the client (docs/hub.md).
  pkg_check_modules(MEGACKPT_MICROHTTPD REQUIRED IMPORTED_TARGET libmicrohttpd)
  pkg_check_modules(MEGACKPT_LIBCURL REQUIRED IMPORTED_TARGET libcurl)
  # CMake >= 4.3 names the target SQLite3::SQLite3 (SQLite::SQLite3 deprecated).
  if(TARGET SQLite3::SQLite3)
    set(MEGACKPT_SQLITE_TARGET SQLite3::SQLite3)
  else()
    set(MEGACKPT_SQLITE_TARGET SQLite::SQLite3)
  endif()
endif()

if(MEGACKPT_WITH_MPI)
  find_package(MPI REQUIRED COMPONENTS C)
  include(${CMAKE_CURRENT_LIST_DIR}/megackpt_mpi.cmake)
endif()

if(MEGACKPT_BUILD_TOOLS)
  find_package(CLI11 REQUIRED)
endif()
