# MegaStorageWriter/Reader over mega:// under mpirun: rank 0 starts a real megahub
# on loopback; a 2-process save is one commit; resharded loads.
if(NOT MEGACKPT_WITH_MPI)
  return()
endif()
include(${CMAKE_CURRENT_LIST_DIR}/mpi.cmake)

megackpt_add_mpi_executable(mega_storage_hub_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/../mega_storage_hub_mpi.cc)
if(TARGET megahub)
  add_dependencies(mega_storage_hub_mpi megahub)
endif()
megackpt_add_mpi_test(NAME mega_storage_hub_mpi_np2 TARGET mega_storage_hub_mpi NP 2 TIMEOUT 120
                      LABELS dcp hub)
