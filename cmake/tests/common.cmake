# Shared by the packaging test scripts (tests/cmake/install.cmake).
foreach(v MEGACKPT_SOURCE_DIR MEGACKPT_BINARY_DIR MEGACKPT_GENERATOR MEGACKPT_CXX_COMPILER)
  if(NOT ${v})
    message(FATAL_ERROR "${v} is required")
  endif()
endforeach()
if(NOT MEGACKPT_BUILD_TYPE)
  set(MEGACKPT_BUILD_TYPE Release)
endif()

# A fresh folder under the system temp dir, removed by megackpt_cleanup().
set(MEGACKPT_TEMP_PREFIX megackpt-packaging)
include(${CMAKE_CURRENT_LIST_DIR}/../make_temp_dir.cmake)
set(TMP "${MEGACKPT_TEMP_DIR}")
message(STATUS "working in ${TMP}")

# ccache shares objects with the main build (same base dir as scripts/build.sh).
set(ENV{CCACHE_BASEDIR} "${MEGACKPT_SOURCE_DIR}")
set(ENV{CCACHE_NOHASHDIR} "1")

function(megackpt_cleanup)
  file(REMOVE_RECURSE "${TMP}")
endfunction()

# megackpt_run(<what> COMMAND ... [ENV k=v ...]): runs, fails the test (after
# cleaning up) when the command fails. Output is shown.
function(megackpt_run what)
  cmake_parse_arguments(R "" "" "COMMAND;ENV" ${ARGN})
  set(cmd ${R_COMMAND})
  if(R_ENV)
    set(cmd ${CMAKE_COMMAND} -E env ${R_ENV} ${R_COMMAND})
  endif()
  message(STATUS "${what}: ${R_COMMAND}")
  execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0)
    megackpt_cleanup()
    message(FATAL_ERROR "${what} failed (${rc})")
  endif()
  set(megackpt_last_output "${out}" PARENT_SCOPE)
endfunction()

set(megackpt_configure_args -G "${MEGACKPT_GENERATOR}"
    -DCMAKE_BUILD_TYPE=${MEGACKPT_BUILD_TYPE}
    -DCMAKE_CXX_COMPILER=${MEGACKPT_CXX_COMPILER})
if(MEGACKPT_C_COMPILER)
  list(APPEND megackpt_configure_args -DCMAKE_C_COMPILER=${MEGACKPT_C_COMPILER})
endif()
find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  list(APPEND megackpt_configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE_PROGRAM})
endif()
