# cmake -DCOMMAND="prog|arg|@TMP@/x" -P run_in_temp_dir.cmake
# Runs COMMAND ('|'-separated) in a new folder under the system temp dir, with
# every @TMP@ replaced by that folder, MEGA_ENDPOINT=file://<tmp>/hub (the
# embedded hub) and HOME=<tmp>; removes the folder afterwards and fails when the
# command does. Lets ctest run programs that write files without writing
# anywhere but a temp folder.
if(NOT COMMAND)
  message(FATAL_ERROR "run_in_temp_dir.cmake: COMMAND is required")
endif()
set(MEGACKPT_TEMP_PREFIX megackpt-run)
include(${CMAKE_CURRENT_LIST_DIR}/make_temp_dir.cmake)
set(tmp "${MEGACKPT_TEMP_DIR}")
string(REPLACE "@TMP@" "${tmp}" cmd "${COMMAND}")
string(REPLACE "|" ";" cmd "${cmd}")
set(ENV{MEGA_ENDPOINT} "file://${tmp}/hub")
set(ENV{MEGA_TOKEN} "")
set(ENV{HOME} "${tmp}")
if(DEFINED WORKING_DIRECTORY)
  set(wd "${WORKING_DIRECTORY}")
else()
  set(wd "${tmp}")
endif()
execute_process(COMMAND ${cmd} WORKING_DIRECTORY "${wd}" RESULT_VARIABLE rc)
file(REMOVE_RECURSE "${tmp}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "command failed (${rc}): ${cmd}")
endif()
