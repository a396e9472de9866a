# tandem_proto_library(NAME PROTOS a.proto b.proto [ROOT dir] [DEPS lib...])
# Generates C++ message and gRPC service code for the listed .proto files
# (paths relative to ROOT, default ${PROJECT_SOURCE_DIR}/proto) into a
# static library.
function(tandem_proto_library name)
  cmake_parse_arguments(ARG "" "ROOT" "PROTOS;DEPS" ${ARGN})
  set(proto_root ${PROJECT_SOURCE_DIR}/proto)
  if(ARG_ROOT)
    set(proto_root ${ARG_ROOT})
  endif()
  set(out_dir ${PROJECT_BINARY_DIR}/gen)
  file(MAKE_DIRECTORY ${out_dir})
  set(srcs)
  foreach(proto ${ARG_PROTOS})
    get_filename_component(dir ${proto} DIRECTORY)
    get_filename_component(stem ${proto} NAME_WE)
    set(base ${out_dir}/${dir}/${stem})
    set(gen ${base}.pb.cc ${base}.pb.h ${base}.grpc.pb.cc ${base}.grpc.pb.h)
    add_custom_command(
      OUTPUT ${gen}
      COMMAND protobuf::protoc
        --proto_path=${proto_root}
        --cpp_out=${out_dir}
        --grpc_out=${out_dir}
        --plugin=protoc-gen-grpc=${TANDEM_GRPC_CPP_PLUGIN}
        ${proto_root}/${proto}
      DEPENDS ${proto_root}/${proto} protobuf::protoc
      COMMENT "protoc ${proto}"
      VERBATIM)
    list(APPEND srcs ${base}.pb.cc ${base}.grpc.pb.cc)
  endforeach()
  add_library(${name} STATIC ${srcs})
  target_include_directories(${name} PUBLIC ${out_dir})
  target_link_libraries(${name} PUBLIC protobuf::libprotobuf PkgConfig::GRPCPP ${ARG_DEPS})
endfunction()

# tandem_add_test(NAME SOURCES a.cc ... [LIBS lib...] [LABELS l...] [TIMEOUT s])
# A Catch2 unit test executable registered with CTest.
function(tandem_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE tandem_catch_main ${ARG_LIBS})
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT}
    LABELS "${ARG_LABELS};unit")
endfunction()
