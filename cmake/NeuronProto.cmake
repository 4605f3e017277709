# neuron_add_proto(TARGET name PROTOS a.proto ...)
# Generates C++ for the given .proto files into the build tree, under the
# same relative path as the source, and builds them into an object library
# that the component links privately or publicly.
function(neuron_add_proto)
  cmake_parse_arguments(ARG "" "TARGET;IMPORT_DIR" "PROTOS" ${ARGN})
  set(srcs)
  set(hdrs)
  foreach(proto ${ARG_PROTOS})
    get_filename_component(abs ${proto} ABSOLUTE)
    file(RELATIVE_PATH rel ${ARG_IMPORT_DIR} ${abs})
    string(REGEX REPLACE "\\.proto$" "" base ${rel})
    set(out_cc ${CMAKE_BINARY_DIR}/gen/${base}.pb.cc)
    set(out_h ${CMAKE_BINARY_DIR}/gen/${base}.pb.h)
    add_custom_command(
      OUTPUT ${out_cc} ${out_h}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/gen
      COMMAND protobuf::protoc --cpp_out=${CMAKE_BINARY_DIR}/gen
              -I ${ARG_IMPORT_DIR} ${abs}
      DEPENDS ${abs} protobuf::protoc
      COMMENT "protoc ${rel}")
    list(APPEND srcs ${out_cc})
    list(APPEND hdrs ${out_h})
  endforeach()
  add_library(${ARG_TARGET} STATIC ${srcs} ${hdrs})
  target_include_directories(${ARG_TARGET} PUBLIC ${CMAKE_BINARY_DIR}/gen)
  target_link_libraries(${ARG_TARGET} PUBLIC protobuf::libprotobuf)
  target_compile_options(${ARG_TARGET} PRIVATE -w)
endfunction()
