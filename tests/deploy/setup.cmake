# Prepares the npm fixture of the deployment tests (run by ctest as
# deploy_npm_setup):
#   cmake -DSOURCE_DIR=... -DWORK_DIR=... -DNPM=... -P setup.cmake
# Installs the pinned packages of package-lock.json (kubernetes-models,
# dockerfile-utils) into WORK_DIR/node_modules; skipped when the lock file is
# unchanged since the last install.
foreach(var SOURCE_DIR WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "setup.cmake: ${var} is not set")
  endif()
endforeach()
if(NOT NPM OR NOT EXISTS "${NPM}")
  message(FATAL_ERROR
    "deploy_npm_setup: npm is required to install kubernetes-models and "
    "dockerfile-utils (found npm='${NPM}'). Install Node.js 18+ and npm "
    "(Debian: apt-get install nodejs npm) and re-run cmake.")
endif()

file(MAKE_DIRECTORY "${WORK_DIR}")
foreach(name package.json package-lock.json)
  configure_file("${SOURCE_DIR}/${name}" "${WORK_DIR}/${name}" COPYONLY)
endforeach()

file(SHA256 "${WORK_DIR}/package-lock.json" lock_hash)
set(stamp "${WORK_DIR}/npm-ci.stamp")
set(installed_hash "")
if(EXISTS "${stamp}")
  file(READ "${stamp}" installed_hash)
endif()
if(NOT installed_hash STREQUAL lock_hash
   OR NOT EXISTS "${WORK_DIR}/node_modules/kubernetes-models/package.json"
   OR NOT EXISTS "${WORK_DIR}/node_modules/dockerfile-utils/package.json")
  execute_process(
    COMMAND "${NPM}" ci --no-audit --no-fund
    WORKING_DIRECTORY "${WORK_DIR}"
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR
      "deploy_npm_setup: 'npm ci' failed in ${WORK_DIR} (${rc}); "
      "the npm registry must be reachable for the first run")
  endif()
  file(WRITE "${stamp}" "${lock_hash}")
endif()
