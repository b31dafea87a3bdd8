# style.clang_format: every C++ source and header matches .clang-format
# (scripts/check-format.sh, Debian's clang-format-14). Registered only where that
# formatter is installed (scripts/install-deps.sh installs it, so CI runs it).
find_program(MEGACKPT_CLANG_FORMAT clang-format-14)
if(MEGACKPT_CLANG_FORMAT)
  add_test(NAME style.clang_format
           COMMAND ${CMAKE_COMMAND} -E env CLANG_FORMAT=${MEGACKPT_CLANG_FORMAT}
                   bash ${PROJECT_SOURCE_DIR}/scripts/check-format.sh)
endif()
