# Packaging tests, each in a fresh temp folder (scripts in cmake/tests/):
#  install_consumer: `cmake --install` of this build into a temp prefix, then an
#    out-of-tree project (tests/consumer) configured with find_package(megackpt)
#    and built against it; its program saves + loads a local folder and a
#    mega:// path (the embedded hub: the mega scheme registers itself through
#    the installed targets' link flags). The same program is also built with
#    `pkg-config --cflags --libs megackpt` and run.
#  lean_build: this source tree configured without hub, CAS, MPI, tools and
#    tests (the lean local-only library), building only examples/save_load,
#    which must not link SQLite, the HTTP libraries or MPI, and must run.
# Both configure with this build's CMake, generator and compiler, under ccache.
set(megackpt_packaging_args
  -DMEGACKPT_SOURCE_DIR=${PROJECT_SOURCE_DIR}
  -DMEGACKPT_BINARY_DIR=${PROJECT_BINARY_DIR}
  -DMEGACKPT_GENERATOR=${CMAKE_GENERATOR}
  -DMEGACKPT_CXX_COMPILER=${CMAKE_CXX_COMPILER}
  -DMEGACKPT_C_COMPILER=${CMAKE_C_COMPILER}
  -DMEGACKPT_BUILD_TYPE=${CMAKE_BUILD_TYPE})
add_test(NAME packaging.install_consumer
         COMMAND ${CMAKE_COMMAND} ${megackpt_packaging_args}
                 -P ${PROJECT_SOURCE_DIR}/cmake/tests/install_consumer.cmake)
add_test(NAME packaging.lean_build
         COMMAND ${CMAKE_COMMAND} ${megackpt_packaging_args}
                 -P ${PROJECT_SOURCE_DIR}/cmake/tests/lean_build.cmake)
# RUN_SERIAL: they build (two compilers at once on a 2-core machine is plenty).
set_tests_properties(packaging.install_consumer packaging.lean_build PROPERTIES
                     LABELS packaging TIMEOUT 1800 RUN_SERIAL ON)
