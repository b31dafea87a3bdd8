# packaging.install_consumer (tests/cmake/install.cmake).
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
set(prefix "${TMP}/prefix")
megackpt_run("install" COMMAND ${CMAKE_COMMAND} --install ${MEGACKPT_BINARY_DIR} --prefix ${prefix})
foreach(f include/megackpt/megackpt.h include/megackpt/config.h include/megackpt/fs/filesystem.h
          lib/libmegackpt_core.a lib/libmegackpt_dcp.a lib/cmake/megackpt/megackptConfig.cmake
          lib/pkgconfig/megackpt.pc)
  if(NOT EXISTS "${prefix}/${f}")
    megackpt_cleanup()
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
file(GLOB private_headers "${prefix}/include/megackpt/*/*_internal.h" "${prefix}/include/dcp")
if(private_headers)
  megackpt_cleanup()
  message(FATAL_ERROR "private headers installed: ${private_headers}")
endif()

# find_package(megackpt) from an out-of-tree project.
megackpt_run("configure consumer" COMMAND ${CMAKE_COMMAND} -S ${MEGACKPT_SOURCE_DIR}/tests/consumer
             -B ${TMP}/consumer ${megackpt_configure_args} -DCMAKE_PREFIX_PATH=${prefix})
megackpt_run("build consumer" COMMAND ${CMAKE_COMMAND} --build ${TMP}/consumer)
megackpt_run("consumer: local save/load" COMMAND ${TMP}/consumer/consumer ${TMP}/ckpt)
if(NOT EXISTS "${TMP}/ckpt/.metadata" OR NOT EXISTS "${TMP}/ckpt/model.mega.index.json")
  megackpt_cleanup()
  message(FATAL_ERROR "the consumer's save left no MEGA checkpoint in ${TMP}/ckpt")
endif()
megackpt_run("consumer: mega:// save/load (embedded hub)"
             COMMAND ${TMP}/consumer/consumer mega://org/consumer@main/ckpt/step-1
             ENV MEGA_ENDPOINT=file://${TMP}/hub MEGA_TOKEN= HOME=${TMP})

# The same program through pkg-config.
find_program(PKG_CONFIG pkg-config REQUIRED)
set(ENV{PKG_CONFIG_PATH} "${prefix}/lib/pkgconfig")
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs megackpt RESULT_VARIABLE rc OUTPUT_VARIABLE flags
                ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  megackpt_cleanup()
  message(FATAL_ERROR "pkg-config --cflags --libs megackpt: ${err}")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
set(cxx ${MEGACKPT_CXX_COMPILER})
if(CCACHE_PROGRAM)
  set(cxx ${CCACHE_PROGRAM} ${MEGACKPT_CXX_COMPILER})
endif()
megackpt_run("build with pkg-config" COMMAND ${cxx} -std=c++20 -O1
             ${MEGACKPT_SOURCE_DIR}/tests/consumer/main.cc -o ${TMP}/pc_consumer ${flags})
megackpt_run("pkg-config consumer: mega:// save/load"
             COMMAND ${TMP}/pc_consumer mega://org/pc@main/ckpt/step-1
             ENV MEGA_ENDPOINT=file://${TMP}/hub MEGA_TOKEN= HOME=${TMP})
megackpt_cleanup()
message(STATUS "install_consumer: OK")
