# The dcp layer's tests launched by mpirun (functions: tests/cmake/mpi.cmake).
if(NOT MEGACKPT_WITH_MPI)
  return()
endif()
include(${CMAKE_CURRENT_LIST_DIR}/mpi.cmake)

# DCP: save from 2 and 4 MPI ranks, resharded loads (MPI and threads), faults
# that must reach every rank.
megackpt_add_mpi_executable(dcp_mpi_checkpoint
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/../dcp_mpi_checkpoint.cc)
megackpt_add_mpi_test(NAME dcp_mpi_checkpoint_np2 TARGET dcp_mpi_checkpoint NP 2 TIMEOUT 180
                      LABELS dcp)
megackpt_add_mpi_test(NAME dcp_mpi_checkpoint_np4 TARGET dcp_mpi_checkpoint NP 4 TIMEOUT 240
                      LABELS dcp)

# The demo under mpirun: saves from the MPI ranks, reloads resharded, exit 0 only
# when every byte matches.
megackpt_add_mpi_test(NAME dcp_mpi_demo_np2 TARGET megackpt_cli NP 2 TIMEOUT 180 LABELS dcp
  ARGS demo --backend mpi --out ${CMAKE_CURRENT_BINARY_DIR}/dcp_mpi_demo_np2 --size 8MB --seed 5)

# MegaStorageWriter/Reader: save from 2 MPI ranks with and without an
# fqn_to_index_mapping, resharded loads, collective consolidation.
megackpt_add_mpi_executable(mega_storage_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/../mega_storage_mpi.cc)
megackpt_add_mpi_test(NAME mega_storage_mpi_np2 TARGET mega_storage_mpi NP 2 TIMEOUT 180
                      LABELS dcp)

# MegaStorageWriter/Reader over mega://: rank 0 starts a real megahub on
# loopback; a 2-process save is one commit; resharded loads.
megackpt_add_mpi_executable(mega_storage_hub_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/../mega_storage_hub_mpi.cc)
if(TARGET megahub)
  add_dependencies(mega_storage_hub_mpi megahub)
endif()
megackpt_add_mpi_test(NAME mega_storage_hub_mpi_np2 TARGET mega_storage_hub_mpi NP 2 TIMEOUT 120
                      LABELS dcp hub)

# The save/load benches with --backend mpi (bench/rank_runner.h): 2 processes
# save, load and check every loaded byte (a mismatch exits 1); rank 0 prints one
# JSON object that names the backend.
foreach(area dcp mega)
  megackpt_add_mpi_test(NAME bench_${area}_mpi_np2 TARGET megackpt_cli NP 2 TIMEOUT 180
    LABELS dcp bench
    ARGS bench ${area} --backend mpi --size 4MB --reps 1 --json
         --dir ${CMAKE_CURRENT_BINARY_DIR}/bench_${area}_mpi_np2
    PROPERTIES PASS_REGULAR_EXPRESSION "\"backend\": \"mpi\".*\"world_size\": 2"
               FAIL_REGULAR_EXPRESSION "\"error\"")
endforeach()

# --over-previous under mpirun: both processes wait for their background frees
# before each preparation, and every save after the first writes over a commit.
megackpt_add_mpi_test(NAME bench_mega_mpi_np2_over_previous TARGET megackpt_cli NP 2 TIMEOUT 180
  LABELS dcp bench
  ARGS bench mega --backend mpi --size 4MB --reps 1 --json --over-previous
       --dir ${CMAKE_CURRENT_BINARY_DIR}/bench_mega_mpi_np2_over_previous
  PROPERTIES PASS_REGULAR_EXPRESSION "\"over_previous\": true.*\"saves_over_a_commit\": 5"
             FAIL_REGULAR_EXPRESSION "\"error\"")

# Rank 0 fails alone (its bench folder cannot be made: the path runs through a
# file): both processes must end at once with one JSON error, not after the
# other rank's 5-minute collective timeout.
megackpt_add_mpi_test(NAME bench_mega_mpi_np2_rank0_error TARGET megackpt_cli NP 2 TIMEOUT 60
  LABELS dcp bench
  ARGS bench mega --backend mpi --size 1MB --reps 1 --json
       --dir $<TARGET_FILE:megackpt_cli>/not-a-folder
  PROPERTIES PASS_REGULAR_EXPRESSION
             "\"error\":.*\"code\":\"IOError\".*\"bench mega: rank 0: cannot create the bench folder")
