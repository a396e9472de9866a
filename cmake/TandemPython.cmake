# The project's Python virtual environment (deploy/local/install-deps.sh):
# TANDEM_PYTHON runs the Python tests and references, and its torch wheel is
# the LibTorch of the whole build (find_package(Torch) through the wheel's
# CMake prefix). deploy/local/build.sh passes TANDEM_PYTHON explicitly.
set(TANDEM_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
  "Python of the project's virtual environment (with torch)")
if(NOT EXISTS "${TANDEM_PYTHON}")
  message(FATAL_ERROR
    "TANDEM_PYTHON=${TANDEM_PYTHON} does not exist: run "
    "deploy/local/install-deps.sh (it makes the virtual environment with "
    "PyPI's torch) or pass -DTANDEM_PYTHON=<venv>/bin/python")
endif()

# LibTorch: the torch wheel of that environment. Its version is pinned in
# deploy/local/requirements.txt; the build refuses a LibTorch without the
# C++11 ABI (every other library here is built with it).
execute_process(
  COMMAND "${TANDEM_PYTHON}" -c
    "import torch; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _tandem_torch_info
  RESULT_VARIABLE _tandem_torch_rc
  ERROR_VARIABLE _tandem_torch_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _tandem_torch_rc EQUAL 0)
  message(FATAL_ERROR "${TANDEM_PYTHON} cannot import torch "
    "(${_tandem_torch_err}): run deploy/local/install-deps.sh")
endif()
string(REPLACE "\n" ";" _tandem_torch_info "${_tandem_torch_info}")
list(GET _tandem_torch_info 0 _tandem_torch_prefix)
list(GET _tandem_torch_info 1 TANDEM_TORCH_VERSION)
list(GET _tandem_torch_info 2 _tandem_torch_cxx11_abi)
list(GET _tandem_torch_info 3 TANDEM_TORCH_CUDA_VERSION)
if(NOT _tandem_torch_cxx11_abi EQUAL 1)
  message(FATAL_ERROR "torch ${TANDEM_TORCH_VERSION} in ${TANDEM_PYTHON} was "
    "built without the C++11 ABI; Tandem needs a wheel that has it (2.7+)")
endif()
list(PREPEND CMAKE_PREFIX_PATH "${_tandem_torch_prefix}")
# Torch's CMake config would otherwise probe this machine's GPUs (none here)
# with a test program, and look for its own Python.
set(TORCH_CUDA_ARCH_LIST "8.0;9.0" CACHE STRING
  "CUDA architectures for Torch's CMake config (A100, H100)")
set(Python_EXECUTABLE "${TANDEM_PYTHON}")
# Its find_library calls search the system first: pin them to the wheel so a
# Debian libtorch-dev on the same machine is never picked up.
get_filename_component(TANDEM_TORCH_DIR "${_tandem_torch_prefix}/../.." ABSOLUTE)
# TorchConfig.cmake reads TORCH_LIBRARY, c10_LIBRARY and C10_CUDA_LIBRARY.
foreach(_pair "TORCH_LIBRARY=torch" "c10_LIBRARY=c10"
              "C10_CUDA_LIBRARY=c10_cuda")
  string(REPLACE "=" ";" _pair "${_pair}")
  list(GET _pair 0 _var)
  list(GET _pair 1 _lib)
  set(_path "${TANDEM_TORCH_DIR}/lib/lib${_lib}.so")
  if(NOT EXISTS "${_path}")
    message(FATAL_ERROR "${_path} is missing: Tandem needs the CUDA build "
      "of the torch wheel (deploy/local/requirements.txt)")
  endif()
  set(${_var} "${_path}" CACHE FILEPATH "" FORCE)
endforeach()
# Torch's CMake config enables the CUDA language, so it needs nvcc and the
# CUDA headers even where no GPU is. A CUDA toolkit at TANDEM_CUDA_ROOT
# (/usr/local/cuda) serves; a machine without one uses the compiler wheels
# pinned next to torch (nvidia-cuda-nvcc, -crt, -nvvm: the same 13.0 as the
# wheel's runtime), which install into the wheel's nvidia/cu13 beside its
# headers and libraries. deploy/local/install-deps.sh adds the two links
# nvcc's linker flags and FindCUDA look for there (lib64 -> lib,
# libcudart.so -> libcudart.so.13). docs/platform.md, "CUDA compiler".
if(NOT EXISTS "${TANDEM_CUDA_ROOT}/bin/nvcc")
  get_filename_component(_tandem_wheel_toolkit
    "${TANDEM_TORCH_DIR}/../nvidia/cu13" ABSOLUTE)
  foreach(_path bin/nvcc nvvm/bin/cicc include/crt/host_config.h lib64
                lib/libcudart.so)
    if(NOT EXISTS "${_tandem_wheel_toolkit}/${_path}")
      message(FATAL_ERROR "No CUDA toolkit at TANDEM_CUDA_ROOT="
        "${TANDEM_CUDA_ROOT}, and the torch wheel's CUDA compiler is "
        "incomplete: ${_tandem_wheel_toolkit}/${_path} is missing. Run "
        "deploy/local/install-deps.sh (it installs nvidia-cuda-nvcc, "
        "nvidia-cuda-crt and nvidia-nvvm from deploy/local/requirements.txt "
        "and adds the links), or pass -DTANDEM_CUDA_ROOT=<toolkit>.")
    endif()
  endforeach()
  set(CUDA_TOOLKIT_ROOT_DIR "${_tandem_wheel_toolkit}" CACHE PATH
    "CUDA toolkit for Torch's CMake config (the torch wheel's)" FORCE)
  set(CMAKE_CUDA_COMPILER "${_tandem_wheel_toolkit}/bin/nvcc" CACHE FILEPATH
    "" FORCE)
  # Torch's targets link CUDA::nvrtc, which FindCUDAToolkit looks for by its
  # unversioned name; the wheel has the versioned one only.
  set(CUDA_nvrtc_LIBRARY "${_tandem_wheel_toolkit}/lib/libnvrtc.so.13" CACHE
    FILEPATH "" FORCE)
  message(STATUS "Tandem: no CUDA toolkit at ${TANDEM_CUDA_ROOT}; Torch's "
    "CMake config uses the wheel's nvcc (${_tandem_wheel_toolkit})")
endif()
find_package(Torch REQUIRED)
# Imported targets are directory-scoped; make Torch's (and the CUDA ones it
# pulls in) global so that every directory links the same targets.
get_property(_tandem_torch_targets DIRECTORY PROPERTY IMPORTED_TARGETS)
foreach(_target ${_tandem_torch_targets})
  get_target_property(_global ${_target} IMPORTED_GLOBAL)
  if(NOT _global)
    set_target_properties(${_target} PROPERTIES IMPORTED_GLOBAL TRUE)
  endif()
endforeach()

# The wheel's include/ also carries the third-party headers LibTorch was built
# with: protobuf 3.13 (google/) and fmt 12 (fmt/). As an -isystem directory it
# would shadow Debian's protobuf 3.21 and fmt 9, which our generated gRPC code
# and spdlog are built against. Tandem's targets see a copy of that folder made
# of links to LibTorch's own headers only.
set(_tandem_torch_include "${CMAKE_BINARY_DIR}/torch_include")
file(REMOVE_RECURSE "${_tandem_torch_include}")
file(MAKE_DIRECTORY "${_tandem_torch_include}")
file(GLOB _entries RELATIVE "${TANDEM_TORCH_DIR}/include"
  "${TANDEM_TORCH_DIR}/include/*")
foreach(_entry ${_entries})
  if(NOT _entry MATCHES "^(google|fmt)$")
    file(CREATE_LINK "${TANDEM_TORCH_DIR}/include/${_entry}"
      "${_tandem_torch_include}/${_entry}" SYMBOLIC)
  endif()
endforeach()
foreach(_target torch torch_cpu torch_cuda c10 c10_cuda)
  if(TARGET ${_target})
    get_target_property(_dirs ${_target} INTERFACE_INCLUDE_DIRECTORIES)
    list(TRANSFORM _dirs REPLACE "^${TANDEM_TORCH_DIR}/include"
      "${_tandem_torch_include}")
    list(REMOVE_DUPLICATES _dirs)
    set_target_properties(${_target} PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${_dirs}")
  endif()
endforeach()

# One CUDA runtime, NVRTC and NCCL in every process: the wheel's (nvidia-*
# packages next to torch), which libtorch_cuda loads through its own RPATH.
# Torch's config would link ours to the toolkit's copies under
# TANDEM_CUDA_ROOT; same sonames, but the loader would then pick those first.
get_filename_component(TANDEM_TORCH_NVIDIA_DIR "${TANDEM_TORCH_DIR}/../nvidia"
  ABSOLUTE)
set(TANDEM_WHEEL_CUDART "${TANDEM_TORCH_NVIDIA_DIR}/cu13/lib/libcudart.so.13")
set(_wheel_nvrtc "${TANDEM_TORCH_NVIDIA_DIR}/cu13/lib/libnvrtc.so.13")
foreach(_path "${TANDEM_WHEEL_CUDART}" "${_wheel_nvrtc}")
  if(NOT EXISTS "${_path}")
    message(FATAL_ERROR "${_path} is missing: the torch wheel's CUDA "
      "libraries (nvidia-cuda-runtime, nvidia-cuda-nvrtc) are not installed")
  endif()
endforeach()
if(TARGET torch::cudart)
  set_target_properties(torch::cudart PROPERTIES
    INTERFACE_LINK_LIBRARIES "${TANDEM_WHEEL_CUDART}")
endif()
list(TRANSFORM TORCH_LIBRARIES REPLACE ".*/libnvrtc\\.so$" "${_wheel_nvrtc}")
# kernels/cuda links this instead of the toolkit's CUDA::cudart.
add_library(tandem_cudart INTERFACE)
target_link_libraries(tandem_cudart INTERFACE "${TANDEM_WHEEL_CUDART}")
target_include_directories(tandem_cudart SYSTEM INTERFACE
  "${TANDEM_CUDA_ROOT}/include")
set(TANDEM_NCCL_INCLUDE_DIR "${TANDEM_TORCH_NVIDIA_DIR}/nccl/include"
  CACHE PATH "" FORCE)
set(TANDEM_NCCL_LIBRARY "${TANDEM_TORCH_NVIDIA_DIR}/nccl/lib/libnccl.so.2"
  CACHE FILEPATH "" FORCE)
# The wheel's libtorch.so exports its own copies of some libstdc++ symbols
# (std::filesystem, std::chrono::tzdb, ...), from the newer toolchain it was
# built with. Listed before it, Debian's libstdc++ is searched first, so our
# code (and LibTorch's) binds to one libstdc++: with libtorch.so first,
# std::filesystem::remove_all jumped to a null pointer.
add_link_options("LINKER:--push-state,--no-as-needed" "-lstdc++"
  "LINKER:--pop-state")
# The executables find the wheel's libraries without LD_LIBRARY_PATH.
list(APPEND CMAKE_BUILD_RPATH "${TANDEM_TORCH_DIR}/lib"
  "${TANDEM_TORCH_NVIDIA_DIR}/cu13/lib" "${TANDEM_TORCH_NVIDIA_DIR}/nccl/lib")
message(STATUS "Tandem: LibTorch ${TANDEM_TORCH_VERSION} "
  "(CUDA ${TANDEM_TORCH_CUDA_VERSION}) from ${TANDEM_TORCH_DIR}")
