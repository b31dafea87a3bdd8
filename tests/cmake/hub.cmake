# Hub tests start real `megahub` (and `megackpt`) child processes: make sure the
# executables are built before the test binaries that launch them.
# (the route and remote-CAS tests, docs/hub.md route table, start megahub too)
foreach(t fs_conformance_test hub_server_test hub_transaction_test hub_cli_test
          hub_routes_test hub_remote_cas_test hub_security_test)
  if(TARGET ${t} AND TARGET megahub)
    add_dependencies(${t} megahub)
  endif()
endforeach()
if(TARGET hub_cli_test)
  add_dependencies(hub_cli_test megackpt_cli)
endif()
# MegaStorageWriter/Reader over mega:// (starts megahub and runs the demo CLI).
if(TARGET mega_storage_hub_test)
  if(TARGET megahub)
    add_dependencies(mega_storage_hub_test megahub)
  endif()
  add_dependencies(mega_storage_hub_test megackpt_cli)
endif()
