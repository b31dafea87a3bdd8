# DCP tests launched by mpirun: save from 2 and 4 MPI ranks, resharded loads
# (MPI and threads), faults that must reach every rank.
if(NOT MEGACKPT_WITH_MPI)
  return()
endif()
include(${CMAKE_CURRENT_LIST_DIR}/mpi.cmake)

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
