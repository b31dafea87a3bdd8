# Sets MEGACKPT_TEMP_DIR to a new folder "<$TMPDIR or /tmp>/${MEGACKPT_TEMP_PREFIX}-<12 random
# characters>" (created): the one temp-folder maker of the cmake -P scripts
# (run_in_temp_dir.cmake, tests/common.cmake). The caller removes it.
if(DEFINED ENV{TMPDIR} AND IS_DIRECTORY "$ENV{TMPDIR}")
  set(_megackpt_tmp_base "$ENV{TMPDIR}")
else()
  set(_megackpt_tmp_base "/tmp")
endif()
string(RANDOM LENGTH 12 ALPHABET "abcdefghijklmnopqrstuvwxyz0123456789" _megackpt_tmp_suffix)
set(MEGACKPT_TEMP_DIR "${_megackpt_tmp_base}/${MEGACKPT_TEMP_PREFIX}-${_megackpt_tmp_suffix}")
file(MAKE_DIRECTORY "${MEGACKPT_TEMP_DIR}")
