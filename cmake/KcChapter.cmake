# kc_add_chapter(): the one function a chapter calls. It creates, for chapter NN named NAME:
#   chNN_NAME         static library with the chapter's kernels (the folder's sources)
#   chNN_NAME_test    GoogleTest program from tests/NN_NAME_test.cu, registered with ctest (label chNN)
#   chNN_NAME_bench   Google Benchmark program from bench/NN_NAME_bench.cu
#   chNN              umbrella target that builds all three
#
#   kc_add_chapter(NUMBER 01 NAME vector_add
#                  SOURCES vector_add_before.cu vector_add_after.cu
#                  EXERCISES vector_add_after.cu        # replaced by exercises/<file> with -DKC_EXERCISES=ON
#                  [HOPPER STUB_SOURCES stub.cu]         # sm_90a only; STUB_SOURCES when no sm_90 is built
#                  [TEST_SOURCES a_test.cu b_test.cu]    # under tests/; default NN_NAME_test.cu
#                  [LINK CUDA::cublas])                  # extra libraries for the kernels, tests and benchmark
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

function(kc_add_chapter)
  cmake_parse_arguments(CH "HOPPER" "NUMBER;NAME" "SOURCES;EXERCISES;STUB_SOURCES;TEST_SOURCES;LINK" ${ARGN})
  set(id "ch${CH_NUMBER}")
  set(lib "${id}_${CH_NAME}")
  set(dir "${CMAKE_CURRENT_SOURCE_DIR}")

  # Workshop mode: the learner's skeleton stands in for the solution file of the same name.
  set(sources "")
  foreach(src IN LISTS CH_SOURCES)
    if(KC_EXERCISES AND src IN_LIST CH_EXERCISES)
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
      # shorthand would also run a plain compute_90 pass that rejects wgmma (HOPPER_NOTES.md section 0).
      set(hopper_arch 90a)
    else()
      message(STATUS "${id}: no sm_90 architecture chosen; building the stub that reports what it needs")
      list(TRANSFORM CH_STUB_SOURCES PREPEND "${dir}/")
      set(sources ${CH_STUB_SOURCES})
    endif()
  endif()

  add_library(${lib} STATIC ${sources})
  target_include_directories(${lib} PUBLIC "${dir}")
  target_link_libraries(${lib} PUBLIC kc_common ${CH_LINK} PRIVATE kc_warnings)
  set_target_properties(${lib} PROPERTIES POSITION_INDEPENDENT_CODE ON)

  if(NOT CH_TEST_SOURCES)
    set(CH_TEST_SOURCES "${CH_NUMBER}_${CH_NAME}_test.cu")
  endif()
  list(TRANSFORM CH_TEST_SOURCES PREPEND "${PROJECT_SOURCE_DIR}/tests/" OUTPUT_VARIABLE test_src)
  add_executable(${lib}_test ${test_src})
  target_link_libraries(${lib}_test PRIVATE ${lib} kc_test_support kc_warnings)
  # PRE_TEST: list the tests when ctest runs, not at build time, so building never needs a GPU.
  gtest_discover_tests(${lib}_test DISCOVERY_MODE PRE_TEST PROPERTIES LABELS "${id};gpu_or_cpu")
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
