# tilec's CMake module: compile .tile files at build time into ordinary library targets.
#
#   list(APPEND CMAKE_PREFIX_PATH "<output of `tilec --cmake-dir`>")
#   find_package(Tilec REQUIRED)
#   tilec_add_library(my_kernels SOURCES ops.tile [more.tile ...]
#                     [TARGET_KIND cpu|cuda|hip] [ARCH <tilec --arch value>])
#   target_link_libraries(my_app PRIVATE my_kernels)
#
# Each .tile file becomes lib<stem>.a and <stem>.h under ${CMAKE_CURRENT_BINARY_DIR}/tilec/<stem>;
# `my_kernels` carries their include directory and what they link against (OpenMP for cpu, the
# CUDA runtime for cuda, the HIP runtime for hip). tilec reruns only when a .tile file or tilec itself changed: it writes
# a depfile that the custom command reads (CMake >= 3.20).

cmake_minimum_required(VERSION 3.20)

if(NOT TILEC_EXECUTABLE)
  find_program(TILEC_EXECUTABLE tilec REQUIRED)
endif()

function(tilec_add_library name)
  cmake_parse_arguments(TILEC "" "TARGET_KIND;ARCH" "SOURCES" ${ARGN})
  if(NOT TILEC_SOURCES)
    message(FATAL_ERROR "tilec_add_library(${name}): SOURCES names no .tile file")
  endif()
  if(NOT TILEC_TARGET_KIND)
    set(TILEC_TARGET_KIND cpu)
  endif()
  if(NOT TILEC_TARGET_KIND MATCHES "^(cpu|cuda|hip)$")
    message(FATAL_ERROR "tilec_add_library(${name}): TARGET_KIND is cpu, cuda or hip, not ${TILEC_TARGET_KIND}")
  endif()
  set(arch_args "")
  if(TILEC_ARCH)
    set(arch_args --arch ${TILEC_ARCH})
  endif()

  add_library(${name} INTERFACE)
  set(outputs "")
  foreach(source IN LISTS TILEC_SOURCES)
    get_filename_component(source "${source}" ABSOLUTE)
    get_filename_component(stem "${source}" NAME_WE)
    string(MAKE_C_IDENTIFIER "${stem}" lib)
    set(out "${CMAKE_CURRENT_BINARY_DIR}/tilec/${lib}")
    file(MAKE_DIRECTORY "${out}")
    # the kernels are compiled by the project's C++ compiler (CUDA kernels by nvcc, HIP ones by
    # hipcc)
    set(compiler_env "")
    if(TILEC_TARGET_KIND STREQUAL "cpu" AND CMAKE_CXX_COMPILER)
      set(compiler_env "CXX=${CMAKE_CXX_COMPILER}")
    endif()
    add_custom_command(
      OUTPUT "${out}/${lib}.stamp" "${out}/lib${lib}.a" "${out}/${lib}.h"
      COMMAND ${CMAKE_COMMAND} -E env ${compiler_env}
              "${TILEC_EXECUTABLE}" build "${source}" --target ${TILEC_TARGET_KIND}
              ${arch_args} -o "${out}"
      DEPENDS "${source}"
      DEPFILE "${out}/${lib}.d"
      COMMENT "tilec: ${stem}.tile -> lib${lib}.a"
      VERBATIM)
    add_library(${name}__${lib} STATIC IMPORTED GLOBAL)
    set_target_properties(${name}__${lib} PROPERTIES IMPORTED_LOCATION "${out}/lib${lib}.a")
    target_link_libraries(${name} INTERFACE ${name}__${lib})
    target_include_directories(${name} INTERFACE "${out}")
    list(APPEND outputs "${out}/${lib}.stamp")
  endforeach()
  add_custom_target(${name}__tilec DEPENDS ${outputs})
  add_dependencies(${name} ${name}__tilec)

  if(TILEC_TARGET_KIND STREQUAL "cpu")
    find_package(OpenMP REQUIRED COMPONENTS CXX)
    target_link_libraries(${name} INTERFACE OpenMP::OpenMP_CXX)
  elseif(TILEC_TARGET_KIND STREQUAL "hip")
    # (hip::host: the runtime library and the platform macro its header needs)
    find_package(hip REQUIRED)
    target_link_libraries(${name} INTERFACE hip::host)
  else()
    find_package(CUDAToolkit REQUIRED)
    target_link_libraries(${name} INTERFACE CUDA::cudart)
  endif()
endfunction()
