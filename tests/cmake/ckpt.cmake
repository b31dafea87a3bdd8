# Checkpoint manager under mpirun: a training loop of incremental saves from 2 MPI
# ranks (each step changes 30% of the entries), the last step reloaded resharded and
# compared byte for byte (exit 0 only when identical).
include(${CMAKE_CURRENT_LIST_DIR}/mpi.cmake)

megackpt_add_mpi_test(NAME ckpt_mpi_incremental_demo_np2 TARGET megackpt_cli NP 2 TIMEOUT 180
  LABELS dcp
  ARGS demo --backend mpi --out ${CMAKE_CURRENT_BINARY_DIR}/ckpt_mpi_incremental_np2 --steps 4
       --change-fraction 0.3 --size 8MB --seed 3
  PROPERTIES PASS_REGULAR_EXPRESSION "referenced.*identical")
