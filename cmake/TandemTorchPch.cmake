# Two precompiled LibTorch headers, each built once for the whole build.
#
# Parsing LibTorch's headers is most of a LibTorch translation unit's cost:
# <ATen/ATen.h> about 30 s of a core, <torch/torch.h> (ATen plus autograd,
# nn and optim) more. A precompiled header removes the parse, but loading
# one is not free and grows with its size (with -g: 0.5 GB for ATen, 0.9 GB
# for torch.h). Measured on this build (docs/platform.md, "Precompiled
# headers"): a unit that needs only ATen compiled in 8.4 s of CPU from the
# ATen header and 19.7 s from the torch.h one; a torch.h unit
# (grpo_trainer.cc) in 24.7 s from the torch.h header and 66 s without.
# So there are two, and each target takes the smaller one that covers what
# its units include:
#   tandem_use_aten_pch(targets...)   <ATen/ATen.h>
#   tandem_use_torch_pch(targets...)  <torch/torch.h>
# Targets whose units mostly include neither take none: every unit of a
# target with a precompiled header pays its load.
#
# GCC uses a precompiled header only where the macros it saw are defined the
# same way, so the headers are built with the definitions every LibTorch
# target has: LibTorch's own, tandem_base's (spdlog, fmt, tandem_features),
# and NOMINMAX, which gRPC's pkg-config flags (Abseil's) add to every target
# that links gRPC and which LibTorch's headers test; the functions define it
# in their targets too. A mismatch is a warning in the build log (CMake
# compiles users with -Winvalid-pch), and the unit then compiles without the
# header: correct, only slow.
foreach(_kind aten torch)
  add_library(tandem_${_kind}_pch STATIC
    ${CMAKE_CURRENT_LIST_DIR}/${_kind}_pch.cc)
  target_link_libraries(tandem_${_kind}_pch PRIVATE ${TORCH_LIBRARIES}
    tandem_base)
  target_compile_definitions(tandem_${_kind}_pch PRIVATE NOMINMAX)
endforeach()
target_precompile_headers(tandem_aten_pch PRIVATE <ATen/ATen.h>)
target_precompile_headers(tandem_torch_pch PRIVATE <torch/torch.h>)

function(_tandem_reuse_pch kind)
  foreach(target ${ARGN})
    target_precompile_headers(${target} REUSE_FROM tandem_${kind}_pch)
    target_compile_definitions(${target} PRIVATE NOMINMAX)
  endforeach()
endfunction()
function(tandem_use_aten_pch)
  _tandem_reuse_pch(aten ${ARGN})
endfunction()
function(tandem_use_torch_pch)
  _tandem_reuse_pch(torch ${ARGN})
endfunction()
