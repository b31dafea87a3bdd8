# Hub tests start real `megahub` (and `megackpt`) child processes: make sure the
# executables are built before the test binaries that launch them.
foreach(t fs_conformance_test hub_server_test hub_transaction_test hub_cli_test)
  if(TARGET ${t})
    if(TARGET megahub)
      add_dependencies(${t} megahub)
    endif()
    add_dependencies(${t} megackpt_cli)
  endif()
endforeach()
