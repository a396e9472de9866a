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

# tandem_add_fuzzer(NAME PARSER lib [LIBS lib...])
# A libFuzzer entry point, NAME_fuzz.cc in the calling folder, for a parser
# library, two ways. With Clang, NAME_fuzz: a libFuzzer binary with ASan
# whose build compiles PARSER's own sources again with instrumentation (so
# the fuzzer sees coverage inside the parser and ASan checks every access),
# linked with LIBS (what those sources need). With any compiler,
# NAME_fuzz_replay: the same entry point with replay_main.cc, linked with
# PARSER, run by CTest over the checked-in corpus corpus/NAME.
function(tandem_add_fuzzer name)
  cmake_parse_arguments(ARG "" "PARSER" "LIBS" ${ARGN})
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    get_target_property(parser_sources ${ARG_PARSER} SOURCES)
    get_target_property(parser_dir ${ARG_PARSER} SOURCE_DIR)
    list(TRANSFORM parser_sources PREPEND "${parser_dir}/")
    add_executable(${name}_fuzz ${name}_fuzz.cc ${parser_sources})
    target_compile_options(${name}_fuzz PRIVATE -fsanitize=fuzzer,address -g)
    target_link_options(${name}_fuzz PRIVATE -fsanitize=fuzzer,address)
    target_link_libraries(${name}_fuzz PRIVATE ${ARG_LIBS})
  endif()
  add_executable(${name}_fuzz_replay ${name}_fuzz.cc replay_main.cc)
  target_link_libraries(${name}_fuzz_replay PRIVATE ${ARG_PARSER})
  add_test(NAME ${name}_fuzz_replay
    COMMAND ${name}_fuzz_replay ${CMAKE_CURRENT_SOURCE_DIR}/corpus/${name})
  set_tests_properties(${name}_fuzz_replay PROPERTIES TIMEOUT 60
    LABELS "fuzz")
endfunction()
