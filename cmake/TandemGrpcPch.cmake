# One precompiled header for the translation units without LibTorch.
#
# About three quarters of a cold build's units include neither LibTorch
# header (cmake/TandemTorchPch.cmake), but nearly all include gRPC,
# Protobuf and Abseil, whose parse is 1.5-3 s of a core per unit, and the
# generated headers of our services. cmake/grpc_pch.h holds those and is
# built once, after tandem_proto (the *_proto targets take none).
#
# tandem_apply_grpc_pch(), called at the end of the top-level CMakeLists,
# walks every target of the build: a C++ target whose link closure reaches
# gRPC (PkgConfig::GRPCPP) and tandem_base, with no precompiled header of
# its own and no CUDA sources, reuses this one (docs/platform.md,
# "Precompiled headers"). As with LibTorch's, GCC uses it only where the
# macros it depends on are defined the same way; a unit where they are not
# compiles without it (a -Winvalid-pch warning: correct, only slower).
# -DTANDEM_GRPC_PCH=OFF turns it off.
add_library(tandem_grpc_pch STATIC ${CMAKE_CURRENT_LIST_DIR}/grpc_pch.cc)
target_link_libraries(tandem_grpc_pch PRIVATE PkgConfig::GRPCPP
  protobuf::libprotobuf tandem_base tandem_proto)
target_compile_definitions(tandem_grpc_pch PRIVATE NOMINMAX)
target_precompile_headers(tandem_grpc_pch PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/grpc_pch.h)

# Whether `target`'s usage requirements (through targets of this build) hold
# PkgConfig::GRPCPP and tandem_base; result in `out` (TRUE/FALSE).
function(_tandem_links_grpc target out)
  set(seen "")
  set(queue ${target})
  set(grpc FALSE)
  set(base FALSE)
  while(queue)
    list(POP_FRONT queue t)
    if(t IN_LIST seen OR NOT TARGET ${t})
      continue()
    endif()
    list(APPEND seen ${t})
    if(t STREQUAL "PkgConfig::GRPCPP")
      set(grpc TRUE)
    elseif(t STREQUAL "tandem_base")
      set(base TRUE)
    endif()
    get_target_property(imported ${t} IMPORTED)
    if(imported)
      continue()
    endif()
    # The target's own links, then its dependencies' usage requirements:
    # the way compile definitions reach it (a PRIVATE link of a dependency
    # gives it nothing to compile with).
    set(libs "")
    if(t STREQUAL target)
      get_target_property(libs ${t} LINK_LIBRARIES)
    endif()
    get_target_property(ilibs ${t} INTERFACE_LINK_LIBRARIES)
    foreach(l IN LISTS libs ilibs)
      if(l AND NOT l MATCHES "NOTFOUND$" AND NOT l MATCHES "^\\$<")
        list(APPEND queue ${l})
      endif()
    endforeach()
  endwhile()
  if(grpc AND base)
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

function(_tandem_targets_under dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _tandem_targets_under(${sub} more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

option(TANDEM_GRPC_PCH "Precompile gRPC/Protobuf/Abseil for units without LibTorch" ON)

function(tandem_apply_grpc_pch)
  if(NOT TANDEM_GRPC_PCH)
    return()
  endif()
  _tandem_targets_under(${CMAKE_SOURCE_DIR} targets)
  set(count 0)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(NOT type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|OBJECT_LIBRARY|EXECUTABLE)$"
       OR t MATCHES "^tandem_(grpc|torch|aten)_pch$" OR t MATCHES "_proto$")
      continue()
    endif()
    get_target_property(own ${t} PRECOMPILE_HEADERS)
    get_target_property(reuse ${t} PRECOMPILE_HEADERS_REUSE_FROM)
    if(own OR reuse)
      continue()
    endif()
    get_target_property(sources ${t} SOURCES)
    set(cxx FALSE)
    set(cuda FALSE)
    foreach(s IN LISTS sources)
      if(s MATCHES "\\.cu$")
        set(cuda TRUE)
      elseif(s MATCHES "\\.(cc|cpp)$")
        set(cxx TRUE)
      endif()
    endforeach()
    if(cuda OR NOT cxx)
      continue()
    endif()
    _tandem_links_grpc(${t} links)
    if(links)
      target_precompile_headers(${t} REUSE_FROM tandem_grpc_pch)
      target_compile_definitions(${t} PRIVATE NOMINMAX)
      math(EXPR count "${count} + 1")
    endif()
  endforeach()
  message(STATUS "Tandem: ${count} targets reuse the gRPC precompiled header")
endfunction()
