# packaging.lean_build (tests/cmake/install.cmake): the local-only library.
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
megackpt_run("configure lean" COMMAND ${CMAKE_COMMAND} -S ${MEGACKPT_SOURCE_DIR} -B ${TMP}/build
             ${megackpt_configure_args}
             -DMEGACKPT_WITH_HUB=OFF -DMEGACKPT_WITH_CAS=OFF -DMEGACKPT_WITH_MPI=OFF
             -DMEGACKPT_BUILD_TOOLS=OFF -DMEGACKPT_BUILD_SERVER=OFF -DMEGACKPT_BUILD_TESTS=OFF
             -DMEGACKPT_BUILD_EXAMPLES=ON -DMEGACKPT_INSTALL=ON)
# What was looked for: none of the heavy dependencies.
file(READ ${TMP}/build/CMakeCache.txt cache)
foreach(dep SQLite3_INCLUDE_DIR MPI_C_COMPILER MEGACKPT_MICROHTTPD_FOUND MEGACKPT_LIBCURL_FOUND MEGACKPT_LZ4_FOUND CLI11_DIR GTest_DIR)
  if(cache MATCHES "\n${dep}[:=]")
    megackpt_cleanup()
    message(FATAL_ERROR "the lean configuration looked for ${dep}")
  endif()
endforeach()
megackpt_run("build lean" COMMAND ${CMAKE_COMMAND} --build ${TMP}/build --target example_save_load)
find_program(LDD ldd)
if(LDD)
  megackpt_run("ldd" COMMAND ${LDD} ${TMP}/build/examples/example_save_load)
  foreach(lib sqlite3 microhttpd curl mpi lz4)
    if(megackpt_last_output MATCHES "lib[^ ]*${lib}")
      megackpt_cleanup()
      message(FATAL_ERROR "the lean library links ${lib}")
    endif()
  endforeach()
endif()
megackpt_run("lean save/load" COMMAND ${TMP}/build/examples/example_save_load ${TMP}/ckpt)
megackpt_cleanup()
message(STATUS "lean_build: OK")
