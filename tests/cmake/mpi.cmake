# Tests launched by mpirun (OpenMPI). See docs/dist.md ("Running under mpirun").
#
#   megackpt_add_mpi_executable(<target> SOURCES <file.cc>... [DEPS <lib>...] [PLAIN_MAIN])
#     Builds an MPI test program linked against DEPS (default: the whole library,
#     `megackpt`, and the test fixtures, `megackpt_testing`; e.g. DEPS megackpt_dist
#     to depend on one layer only).
#     Default: a gtest program; main() comes from tests/dist_mpi_gtest_main.cc, which
#     initializes MPI (NewMpiProcessGroup), lets only rank 0 print the normal gtest
#     output (other ranks print their failures only, tagged "[rank R]"), combines every
#     rank's result so that all ranks exit non-zero when any rank had a failing test,
#     and finalizes MPI. Tests create their own groups with NewMpiProcessGroup().
#     PLAIN_MAIN: the sources define main() themselves (return non-zero on failure).
#     Do NOT name MPI test sources tests/*_test.cc: those are globbed into ordinary
#     (non-mpirun) gtest binaries by tests/CMakeLists.txt.
#
#   megackpt_add_mpi_test(NAME <test> TARGET <target> NP <n> [ARGS <arg>...]
#                         [TIMEOUT <seconds>] [LABELS <label>...]
#                         [MPI_FLAGS <mpirun flag>...] [PROPERTIES <ctest prop> <value>...])
#     Registers a ctest running
#       ${MPIEXEC_EXECUTABLE} ${MEGACKPT_MPIEXEC_FLAGS} <mpi flags> -np <n> $<TARGET_FILE:target> <args>
#     with OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in the environment
#     (CI runs as root), LABELS mpi (+ extra) and TIMEOUT (default 60 s). PROPERTIES
#     are extra set_tests_properties pairs (e.g. PASS_REGULAR_EXPRESSION "...").
#
# Other tests/cmake/*.cmake files are included in alphabetical order; a file that uses
# these functions must first do
#   include(${CMAKE_CURRENT_LIST_DIR}/mpi.cmake)
# (this file is include-guarded, so including it twice is fine).
include_guard(GLOBAL)
if(NOT MEGACKPT_WITH_MPI)
  return()  # built without MPI: no mpirun tests
endif()

# MEGACKPT_MPIEXEC_FLAGS and MEGACKPT_MPI_TEST_ENV: cmake/megackpt_mpi.cmake (shared with examples/).

if(NOT TARGET megackpt_mpi_gtest_main)
  add_library(megackpt_mpi_gtest_main STATIC ${CMAKE_CURRENT_LIST_DIR}/../dist_mpi_gtest_main.cc)
  target_link_libraries(megackpt_mpi_gtest_main PUBLIC megackpt_dist GTest::gtest GTest::gmock)
endif()

function(megackpt_add_mpi_executable target)
  cmake_parse_arguments(M "PLAIN_MAIN" "" "SOURCES;DEPS" ${ARGN})
  if(NOT M_SOURCES)
    message(FATAL_ERROR "megackpt_add_mpi_executable(${target}): SOURCES is required")
  endif()
  add_executable(${target} ${M_SOURCES})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/src
                             ${CMAKE_CURRENT_LIST_DIR}/..)
  if(NOT M_DEPS)
    set(M_DEPS megackpt megackpt_testing)
  endif()
  if(M_PLAIN_MAIN)
    target_link_libraries(${target} PRIVATE ${M_DEPS} MPI::MPI_C)
  else()
    target_link_libraries(${target} PRIVATE megackpt_mpi_gtest_main ${M_DEPS} MPI::MPI_C)
  endif()
  megackpt_test_definitions(${target})
endfunction()

function(megackpt_add_mpi_test)
  cmake_parse_arguments(M "" "NAME;TARGET;NP;TIMEOUT" "ARGS;LABELS;MPI_FLAGS;PROPERTIES" ${ARGN})
  if(NOT M_NAME OR NOT M_TARGET OR NOT M_NP)
    message(FATAL_ERROR "megackpt_add_mpi_test: NAME, TARGET and NP are required")
  endif()
  if(NOT M_TIMEOUT)
    set(M_TIMEOUT 60)
  endif()
  add_test(NAME ${M_NAME}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MEGACKPT_MPIEXEC_FLAGS} ${M_MPI_FLAGS}
                   ${MPIEXEC_NUMPROC_FLAG} ${M_NP}
                   $<TARGET_FILE:${M_TARGET}> ${M_ARGS})
  # PROCESSORS: ctest -j schedules fewer concurrent tests next to a 4-rank job.
  set_tests_properties(${M_NAME} PROPERTIES
                       ENVIRONMENT "${MEGACKPT_MPI_TEST_ENV}"
                       LABELS "mpi;${M_LABELS}"
                       TIMEOUT ${M_TIMEOUT}
                       PROCESSORS ${M_NP})
  if(M_PROPERTIES)
    set_tests_properties(${M_NAME} PROPERTIES ${M_PROPERTIES})
  endif()
endfunction()

# ---- the dist layer's own MPI tests ----------------------------------------------
megackpt_add_mpi_executable(dist_mpi_collectives
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/../dist_mpi_collectives.cc DEPS megackpt_dist)
megackpt_add_mpi_test(NAME dist_mpi_collectives_np2 TARGET dist_mpi_collectives NP 2 TIMEOUT 60)
megackpt_add_mpi_test(NAME dist_mpi_collectives_np4 TARGET dist_mpi_collectives NP 4 TIMEOUT 60)

# A rank leaving early (tests/dist_mpi_early_exit.cc explains each scenario).
megackpt_add_mpi_executable(dist_mpi_early_exit PLAIN_MAIN
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/../dist_mpi_early_exit.cc DEPS megackpt_dist)
megackpt_add_mpi_test(NAME dist_mpi_early_return_np3 TARGET dist_mpi_early_exit NP 3
  ARGS return TIMEOUT 30)
megackpt_add_mpi_test(NAME dist_mpi_killed_rank_np3 TARGET dist_mpi_early_exit NP 3
  ARGS kill TIMEOUT 30
  PROPERTIES PASS_REGULAR_EXPRESSION "exited on signal 9" FAIL_REGULAR_EXPRESSION "FAIL")
megackpt_add_mpi_test(NAME dist_mpi_killed_rank_recovery_np3 TARGET dist_mpi_early_exit NP 3
  ARGS kill-recovery TIMEOUT 30 MPI_FLAGS --enable-recovery
  PROPERTIES PASS_REGULAR_EXPRESSION "rank 0: PASS" FAIL_REGULAR_EXPRESSION "FAIL")
megackpt_add_mpi_test(NAME dist_mpi_exited_rank_recovery_np3 TARGET dist_mpi_early_exit NP 3
  ARGS exit-recovery TIMEOUT 30 MPI_FLAGS --enable-recovery
  PROPERTIES PASS_REGULAR_EXPRESSION "rank 0: PASS" FAIL_REGULAR_EXPRESSION "FAIL")

# Without mpirun, NewMpiProcessGroup() runs in OpenMPI's singleton mode (a world of
# one); multi-rank tests skip themselves.
add_test(NAME dist_mpi_singleton COMMAND dist_mpi_collectives)
set_tests_properties(dist_mpi_singleton PROPERTIES ENVIRONMENT "${MEGACKPT_MPI_TEST_ENV}"
                     LABELS mpi TIMEOUT 60)
