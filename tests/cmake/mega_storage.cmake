# MegaStorageWriter/Reader under mpirun: save from 2 MPI ranks with and without an
# fqn_to_index_mapping, resharded loads, collective consolidation.
if(NOT MEGACKPT_WITH_MPI)
  return()
endif()
include(${CMAKE_CURRENT_LIST_DIR}/mpi.cmake)

megackpt_add_mpi_executable(mega_storage_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/../mega_storage_mpi.cc)
megackpt_add_mpi_test(NAME mega_storage_mpi_np2 TARGET mega_storage_mpi NP 2 TIMEOUT 180
                      LABELS dcp)
