# ptxas's resource report of every CUDA file of the engine's hot path (engine/ops/ and
# engine/backend/cuda/): one build/ptxas/<path>.txt per .cu, made by the `ptxas_report` target
# (part of ALL), read by tests/engine/ptxas_report_test.sh (registers, spills, shared memory, the
# wgmma-serialisation advisories). The library build already fails on a spill (-warn-spills with
# warnings as errors); this report is the readable second check, and what a reviewer reads.
#
# Included from engine/CMakeLists.txt. Also run as a script (cmake -P) by the custom commands
# below, to capture nvcc's stderr into the report file:
#   cmake -DPTXAS_REPORT=<file> -P ptxas_report.cmake -- <nvcc> <argument>...

if(CMAKE_SCRIPT_MODE_FILE)
  # Script mode: the arguments after "-P <this file> --" are the command ("--" keeps cmake from
  # reading nvcc's -D options as its own).
  set(command)
  set(first -1)
  math(EXPR last "${CMAKE_ARGC} - 1")
  foreach(i RANGE 1 ${last})
    if(first EQUAL -1 AND CMAKE_ARGV${i} STREQUAL "-P")
      math(EXPR first "${i} + 3")
    elseif(NOT first EQUAL -1 AND i GREATER_EQUAL first)
      list(APPEND command "${CMAKE_ARGV${i}}")
    endif()
  endforeach()
  if(NOT PTXAS_REPORT OR NOT command)
    message(FATAL_ERROR
            "usage: cmake -DPTXAS_REPORT=<file> -P ptxas_report.cmake -- <nvcc> <arg>...")
  endif()
  execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    # No report is written, so a failed compile cannot leave a stale report that looks fine.
    file(REMOVE "${PTXAS_REPORT}")
    message(FATAL_ERROR "ptxas report: the compile failed (${rc}):\n${out}${err}")
  endif()
  file(WRITE "${PTXAS_REPORT}" "${out}${err}")
  return()
endif()

if(NOT MOETRAIN_WITH_CUDA)
  return()
endif()

# The library's CUDA flags (engine/CMakeLists.txt, moetrain_engine_library), at -O3 whatever the
# build type, since the report is about the code that runs in training. -cubin for sm_90a only:
# ptxas's work without the host compile, so the report adds a few seconds per file.
file(GLOB_RECURSE _moetrain_ptxas_sources CONFIGURE_DEPENDS
     ${PROJECT_SOURCE_DIR}/engine/ops/*.cu ${PROJECT_SOURCE_DIR}/engine/backend/cuda/*.cu)
# Hidden files are an editor's or a tool's scratch copies, not sources.
list(FILTER _moetrain_ptxas_sources EXCLUDE REGEX "/\\.[^/]*$")
list(SORT _moetrain_ptxas_sources)
get_directory_property(_moetrain_ptxas_definitions DIRECTORY ${PROJECT_SOURCE_DIR}
                       COMPILE_DEFINITIONS)
set(_moetrain_ptxas_flags -DMOETRAIN_HAVE_CUDA=1)
foreach(definition IN LISTS _moetrain_ptxas_definitions)
  list(APPEND _moetrain_ptxas_flags "-D${definition}")
endforeach()
list(APPEND _moetrain_ptxas_flags -I${PROJECT_SOURCE_DIR})
foreach(include_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
  list(APPEND _moetrain_ptxas_flags -isystem=${include_dir})
endforeach()
list(APPEND _moetrain_ptxas_flags -O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a
     --expt-relaxed-constexpr -std=c++20 -Xptxas=-v -cubin -o /dev/null)

set(_moetrain_ptxas_reports)
foreach(source IN LISTS _moetrain_ptxas_sources)
  file(RELATIVE_PATH relative ${PROJECT_SOURCE_DIR} ${source})
  string(REGEX REPLACE "\\.cu$" ".txt" relative "${relative}")
  set(report ${CMAKE_BINARY_DIR}/ptxas/${relative})
  get_filename_component(report_dir ${report} DIRECTORY)
  file(MAKE_DIRECTORY ${report_dir})
  # The depfile makes a change to any included header redo the report, as it redoes the object.
  add_custom_command(
    OUTPUT ${report}
    COMMAND ${CMAKE_COMMAND} -DPTXAS_REPORT=${report} -P ${CMAKE_CURRENT_LIST_FILE} --
            ${CMAKE_CUDA_COMPILER} ${_moetrain_ptxas_flags} -MD -MF ${report}.d -MT ${report}
            ${source}
    DEPENDS ${source} ${CMAKE_CURRENT_LIST_FILE}
    DEPFILE ${report}.d
    COMMENT "ptxas resource report of ${relative}"
    VERBATIM)
  list(APPEND _moetrain_ptxas_reports ${report})
endforeach()
add_custom_target(ptxas_report ALL DEPENDS ${_moetrain_ptxas_reports})
