# The MEGA half of the corruption sweep (tests/corruption_sweep_mega.cc). OFF
# until MegaStorageReader verifies partial reads by default (issue 11, MEGA
# block verification); turn the default ON when that work is merged.
option(MEGACKPT_MEGA_SWEEP "Build and run the MEGA-storage corruption sweep" OFF)
add_executable(corruption_sweep_mega ${CMAKE_CURRENT_SOURCE_DIR}/corruption_sweep_mega.cc)
target_include_directories(corruption_sweep_mega PRIVATE ${PROJECT_SOURCE_DIR}/src ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(corruption_sweep_mega PRIVATE megackpt GTest::gtest_main)
megackpt_test_definitions(corruption_sweep_mega)
if(MEGACKPT_MEGA_SWEEP)
  gtest_discover_tests(corruption_sweep_mega DISCOVERY_TIMEOUT 120 PROPERTIES LABELS integration TIMEOUT 900)
else()
  set_target_properties(corruption_sweep_mega PROPERTIES EXCLUDE_FROM_ALL ON)
endif()
