# kc_add_chapter(): the one function a chapter calls. It creates, for chapter NN named NAME:
#   chNN_NAME         static library with the chapter's kernels (the folder's sources)
#   chNN_NAME_test    GoogleTest program from tests/NN_NAME_test.cu, registered with ctest (label chNN)
#   chNN_NAME_bench   Google Benchmark program from bench/NN_NAME_bench.cu
#   chNN              umbrella target that builds all three
#
#   kc_add_chapter(NUMBER 01 NAME vector_add
#                  SOURCES vector_add_before.cu vector_add_after.cu
#                  EXERCISES vector_add_after.cu        # replaced by exercises/<file> with -DKC_EXERCISES=ON
#                  [EXERCISE_HEADERS tile_map.hpp]       # headers with exercise regions (included with <>)
#                  [HOPPER STUB_SOURCES stub.cu]         # sm_90a only; STUB_SOURCES when no sm_90 is built
#                  [TEST_SOURCES a_test.cu b_test.cu]    # under tests/; default NN_NAME_test.cu
#                  [LINK CUDA::cublas]                   # extra libraries for the kernels, tests and benchmark
#                  [GPU_TIMING_TESTS regex])             # more tests that run alone (besides names with "Timing")
#
# Tests run in parallel (the test presets set ctest's jobs). A test that times the GPU, or needs all of
# it, runs alone: put "Timing" in its suite or test name, or match it with GPU_TIMING_TESTS.
include_guard(GLOBAL)

# Host and device warnings for every target of the course.
add_library(kc_warnings INTERFACE)
target_compile_options(kc_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wshadow -Wnon-virtual-dtor>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra -Xptxas=-warn-spills,-warn-lmem-usage -lineinfo>)
if(KC_WARNINGS_AS_ERRORS)
  target_compile_options(kc_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Werror>)
endif()

# True when the chosen architectures include an sm_90 entry (90, 90-real, 90a, ...).
function(kc_builds_sm90 out_var)
  set(found FALSE)
  foreach(arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
    if(arch MATCHES "^90")
      set(found TRUE)
    endif()
  endforeach()
  set(${out_var} ${found} PARENT_SCOPE)
endfunction()

# Tests that time the GPU, or need all of it, run alone: ctest gives every test whose name (Suite.Test,
# with its parameter) matches this regex the property RUN_SERIAL, so no other test runs beside it (a
# kernel of another process on the same GPU shares its time slices and stretches the timed launches).
# Other tests run in parallel (the test presets set the number of jobs).
# Name a test `...Timing...` (e.g. `SgemmGpuTiming.AfterBeatsBefore`) to make it run alone.
set(KC_GPU_TIMING_TEST_REGEX "Timing" CACHE STRING "Tests whose name matches this run alone (RUN_SERIAL)")

# kc_discover_tests(target LABELS a;b [GPU_TIMING regex]): registers a GoogleTest program's tests with
# ctest, labelled, and makes those matching KC_GPU_TIMING_TEST_REGEX (or GPU_TIMING) run alone.
function(kc_discover_tests target)
  cmake_parse_arguments(T "" "GPU_TIMING" "LABELS" ${ARGN})
  # PRE_TEST: list the tests when ctest runs, not at build time, so building never needs a GPU.
  gtest_discover_tests(${target} DISCOVERY_MODE PRE_TEST TEST_LIST ${target}_TESTS PROPERTIES LABELS "${T_LABELS}")
  set(regex "${KC_GPU_TIMING_TEST_REGEX}")
  if(T_GPU_TIMING)
    set(regex "${regex}|${T_GPU_TIMING}")
  endif()
  # Runs in ctest after the discovered tests' file (which sets ${target}_TESTS to their names).
  set(serial_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_run_alone.cmake")
  file(WRITE "${serial_file}"
    "foreach(kc_test IN LISTS ${target}_TESTS)\n"
    "  if(kc_test MATCHES [==[${regex}]==])\n"
    "    set_tests_properties(\"\${kc_test}\" PROPERTIES RUN_SERIAL TRUE)\n"
    "  endif()\n"
    "endforeach()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${serial_file}")
endfunction()

function(kc_add_chapter)
  cmake_parse_arguments(CH "HOPPER" "NUMBER;NAME;GPU_TIMING_TESTS" "SOURCES;EXERCISES;EXERCISE_HEADERS;STUB_SOURCES;TEST_SOURCES;LINK" ${ARGN})
  set(id "ch${CH_NUMBER}")
  set(lib "${id}_${CH_NAME}")
  set(dir "${CMAKE_CURRENT_SOURCE_DIR}")

  # Workshop mode: the learner's skeleton stands in for the solution file of the same name, in every
  # chapter or only in those KC_EXERCISE_CHAPTERS names (so a chapter's tests see no other skeleton).
  set(swap FALSE)
  if(KC_EXERCISES AND (NOT KC_EXERCISE_CHAPTERS OR id IN_LIST KC_EXERCISE_CHAPTERS))
    set(swap TRUE)
  endif()
  set(sources "")
  foreach(src IN LISTS CH_SOURCES)
    if(swap AND src IN_LIST CH_EXERCISES)
      list(APPEND sources "${dir}/exercises/${src}")
    else()
      list(APPEND sources "${dir}/${src}")
    endif()
  endforeach()

  set(hopper_arch "")
  if(CH_HOPPER)
    kc_builds_sm90(has_sm90)
    if(has_sm90)
      # CMake's 90a means -gencode arch=compute_90a,code=[sm_90a,compute_90a]; nvcc's -arch=sm_90a
      # shorthand would also run a plain compute_90 pass, which rejects wgmma.
      set(hopper_arch 90a)
    else()
      message(STATUS "${id}: no sm_90 architecture chosen; building the stub that reports what it needs")
      list(TRANSFORM CH_STUB_SOURCES PREPEND "${dir}/")
      set(sources ${CH_STUB_SOURCES})
    endif()
  endif()

  add_library(${lib} STATIC ${sources})
  target_include_directories(${lib} PUBLIC "${dir}")
  if(swap AND CH_EXERCISE_HEADERS)
    # Headers with exercise regions: their skeletons in exercises/ come first on the include path (the
    # chapter includes them with angle brackets, so the including file's own folder is not searched first).
    target_include_directories(${lib} BEFORE PUBLIC "${dir}/exercises")
  endif()
  target_link_libraries(${lib} PUBLIC kc_common ${CH_LINK} PRIVATE kc_warnings)
  set_target_properties(${lib} PROPERTIES POSITION_INDEPENDENT_CODE ON)

  if(NOT CH_TEST_SOURCES)
    set(CH_TEST_SOURCES "${CH_NUMBER}_${CH_NAME}_test.cu")
  endif()
  list(TRANSFORM CH_TEST_SOURCES PREPEND "${PROJECT_SOURCE_DIR}/tests/" OUTPUT_VARIABLE test_src)
  add_executable(${lib}_test ${test_src})
  target_link_libraries(${lib}_test PRIVATE ${lib} kc_test_support kc_warnings)
  kc_discover_tests(${lib}_test LABELS "${id};gpu_or_cpu" GPU_TIMING "${CH_GPU_TIMING_TESTS}")
  set_property(GLOBAL APPEND PROPERTY KC_TEST_TARGETS ${lib}_test)
  set(umbrella ${lib} ${lib}_test)

  set(bench_src "${PROJECT_SOURCE_DIR}/bench/${CH_NUMBER}_${CH_NAME}_bench.cu")
  add_executable(${lib}_bench ${bench_src})
  target_link_libraries(${lib}_bench PRIVATE ${lib} kc_bench_support kc_warnings)
  list(APPEND umbrella ${lib}_bench)
  set_property(GLOBAL APPEND PROPERTY KC_BENCH_TARGETS ${lib}_bench)

  if(hopper_arch)
    set_target_properties(${umbrella} PROPERTIES CUDA_ARCHITECTURES ${hopper_arch})
  endif()
  add_custom_target(${id} DEPENDS ${umbrella})
  set_property(GLOBAL APPEND PROPERTY KC_CHAPTERS ${id})
endfunction()
