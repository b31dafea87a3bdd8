# How megackpt's tests and examples launch mpirun (OpenMPI). See docs/dist.md
# ("Running under mpirun"); tests/cmake/mpi.cmake has the test helpers.
# Why each flag (all verified in the Debian 12 container, root, loopback only, 2 cores):
#  --oversubscribe            more ranks than cores (np 4 on 2 cores).
#  --bind-to none             do not pin ranks to cores on a shared machine.
#  --mca pml ob1 / btl self,vader
#                             shared-memory transport only, no UCX/verbs/TCP probing.
#  btl_vader_single_copy_mechanism none
#                             CMA (process_vm_readv) needs ptrace rights that
#                             containers often deny; plain copy-in/copy-out always works.
#  oob_tcp_if_include lo      the runtime's out-of-band channel uses loopback only.
set(MEGACKPT_MPIEXEC_FLAGS
    --oversubscribe --bind-to none
    --mca pml ob1 --mca btl self,vader --mca btl_vader_single_copy_mechanism none
    --mca oob_tcp_if_include lo
    CACHE STRING "Flags passed to mpirun before -np by megackpt_add_mpi_test")

set(MEGACKPT_MPI_TEST_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
