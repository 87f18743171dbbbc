# Small helpers in the spirit of Bazel's cc_library / cc_test / cc_binary.
#
#   dtrain_cc_library(NAME name SRCS a.cc b.cc DEPS lib1 lib2 [PUBLIC_DEPS ...])
#   dtrain_cc_test(NAME name SRCS a_test.cc DEPS lib [LABELS slow] [TIMEOUT 120] [COST seconds]
#                  [SKIPPABLE group filter ...])
#     COST: about how long the test runs where it is slowest (the sanitizer build for a unit test): ctest -j starts
#     the costliest first when it has no cost data of its own (a fresh clone, CI), so the suite does not end
#     on a long test that happened to start last
#   dtrain_cc_binary(NAME name SRCS main.cc DEPS lib)
#   dtrain_flag_names(NAME lib FUNCTION Fn SOURCES main.cc ...): a library whose Fn() returns the names of the
#     flags those sources define (a binary that shares a --flagfile with them: common/command_line.h)
include(GoogleTest)

# The unit tests (every dtrain_cc_test not labelled "integration") are built with 'all' and registered with ctest
# by default. scripts/test.sh turns this off in its main (Release) build when its sanitizer stage builds and runs
# them (ASan+UBSan, build-asan/): CI then compiles each unit test once. Kept on here whatever the option: the
# tests only a CUDA build has (DTRAIN_TEST_NEEDS_CUDA, set by kernels/cuda) and those with a "gpu" SKIPPABLE group,
# whose GPU code the sanitizer build (no CUDA) would not compile.
option(DTRAIN_UNIT_TESTS_IN_ALL "Build the unit tests with 'all' and register them with ctest" ON)
# Extra compile options of the test sources only (not the code under test), e.g. -O0 in the sanitizer build:
# gtest-heavy test files compile in half the time and the libraries keep their optimization.
set(DTRAIN_TEST_COMPILE_OPTIONS "" CACHE STRING "Compile options added to the test binaries' own sources")

# The headers nearly every test includes (GoogleTest, GoogleMock, the Abseil basics, the standard library), parsed
# once into a precompiled header that every test binary reuses (target dtrain_test_pch): a gtest-heavy test file
# spent about a third of its compile time parsing them. Only third-party headers: a change of ours never rebuilds
# it. A test whose flags differ in a way the compiler cannot accept (gcc checks them) parses the headers as usual.
option(DTRAIN_TEST_PCH "Precompile the headers the tests share, once for every test binary" ON)

# Called once, from the top-level CMakeLists.txt, after the packages are found.
function(dtrain_test_pch_target)
  if(NOT DTRAIN_TEST_PCH)
    return()
  endif()
  add_library(dtrain_test_pch OBJECT ${PROJECT_SOURCE_DIR}/common/testing/test_pch.cc)
  target_link_libraries(dtrain_test_pch PRIVATE GTest::gtest GTest::gmock absl::strings absl::str_format
                        absl::status absl::statusor absl::time absl::synchronization OpenMP::OpenMP_CXX)
  target_compile_options(dtrain_test_pch PRIVATE -Wall -Wextra -Wno-unused-parameter ${DTRAIN_TEST_COMPILE_OPTIONS})
  target_precompile_headers(dtrain_test_pch PRIVATE
    <algorithm> <atomic> <cmath> <cstdint> <cstdio> <cstdlib> <cstring> <filesystem> <fstream> <functional>
    <map> <memory> <optional> <random> <set> <string> <thread> <utility> <vector>
    <gtest/gtest.h> <gmock/gmock.h>
    [["absl/status/status.h"]] [["absl/status/statusor.h"]] [["absl/strings/match.h"]] [["absl/strings/str_cat.h"]]
    [["absl/strings/str_format.h"]] [["absl/synchronization/mutex.h"]] [["absl/time/clock.h"]] [["absl/time/time.h"]])
endfunction()

function(dtrain_cc_library)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(${A_NAME} STATIC ${A_SRCS})
  target_include_directories(${A_NAME} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(${A_NAME} PUBLIC ${A_DEPS})
  target_compile_options(${A_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
endfunction()

function(dtrain_cc_binary)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${A_NAME} ${A_SRCS})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS})
  target_compile_options(${A_NAME} PRIVATE -Wall -Wextra -Wno-unused-parameter)
endfunction()

# Each test binary is registered with ctest as a whole (one ctest entry per binary) so that process-level
# timeouts apply. Its main() is common/testing/gtest_main.cc: a binary whose tests all GTEST_SKIP() exits 77 and
# ctest reports it "Skipped" (SKIP_RETURN_CODE), never "Passed".
#
# Tests that may skip (no GPU, no data set, no numpy...) beside tests that always run go into their own ctest
# entries, so that each skip shows: SKIPPABLE takes pairs <group> <gtest filter>; each pair becomes the entry
# <name>.<group> running only the tests its filter matches, and the entry <name> runs everything else. An entry
# in which some tests pass and others skip fails with a message naming them (--dtrain_fail_on_mixed_skips), and
# an entry whose filter matches no test fails too, so a registration cannot rot silently.
#
#   dtrain_cc_test(NAME towers_test SRCS towers_test.cc DEPS dtrain_worker_lib
#                  SKIPPABLE gpu "TowersTest.Gpu*:TowersTest.TwoGpu*" no_gpu "TowersTest.*WithoutGpu*")
#
# dtrain_test_skippable(<test name> <group> <filter> ...) declares the same pairs ahead of the dtrain_cc_test
# call (for instance in a parent folder's CMakeLists.txt, before its add_subdirectory); they add to SKIPPABLE.
function(dtrain_test_skippable name)
  set_property(GLOBAL APPEND PROPERTY DTRAIN_SKIPPABLE_${name} ${ARGN})
endfunction()

function(dtrain_cc_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT;COST" "SRCS;DEPS;LABELS;SKIPPABLE" ${ARGN})
  get_property(declared GLOBAL PROPERTY DTRAIN_SKIPPABLE_${A_NAME})
  list(APPEND A_SKIPPABLE ${declared})
  set(unit_elsewhere OFF)
  if(NOT DTRAIN_UNIT_TESTS_IN_ALL AND NOT "integration" IN_LIST A_LABELS AND NOT DTRAIN_TEST_NEEDS_CUDA
     AND NOT "gpu" IN_LIST A_SKIPPABLE)
    set(unit_elsewhere ON)
  endif()
  if(unit_elsewhere)
    add_executable(${A_NAME} EXCLUDE_FROM_ALL ${A_SRCS})
  else()
    add_executable(${A_NAME} ${A_SRCS})
  endif()
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS} GTest::gtest dtrain_gtest_main)
  # Unit tests (everything but the multi-process tests labelled "integration") make up dtrain_unit_tests,
  # what the sanitizer build compiles.
  if(NOT "integration" IN_LIST A_LABELS)
    add_dependencies(dtrain_unit_tests ${A_NAME})
  endif()
  target_compile_options(${A_NAME} PRIVATE -Wall -Wextra -Wno-unused-parameter ${DTRAIN_TEST_COMPILE_OPTIONS})
  if(TARGET dtrain_test_pch)
    # OpenMP on every test (most have it through the kernels): gcc takes a precompiled header only where _OPENMP
    # is defined the same way.
    target_link_libraries(${A_NAME} PRIVATE OpenMP::OpenMP_CXX)
    target_precompile_headers(${A_NAME} REUSE_FROM dtrain_test_pch)
  endif()
  if(unit_elsewhere)
    return()  # built on demand (dtrain_unit_tests), not run by this build's ctest
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  list(LENGTH A_SKIPPABLE n)
  math(EXPR odd "${n} % 2")
  if(odd)
    message(FATAL_ERROR "dtrain_cc_test(${A_NAME}): SKIPPABLE takes pairs <group> <gtest filter>")
  endif()
  set(entries ${A_NAME})
  set(excluded "")
  if(n GREATER 0)
    math(EXPR last "${n} - 1")
    foreach(i RANGE 0 ${last} 2)
      math(EXPR j "${i} + 1")
      list(GET A_SKIPPABLE ${i} group)
      list(GET A_SKIPPABLE ${j} filter)
      add_test(NAME ${A_NAME}.${group}
               COMMAND ${A_NAME} --dtrain_fail_on_mixed_skips --gtest_filter=${filter})
      list(APPEND entries ${A_NAME}.${group})
      if(excluded)
        string(APPEND excluded ":")
      endif()
      string(APPEND excluded "${filter}")
    endforeach()
    add_test(NAME ${A_NAME} COMMAND ${A_NAME} --dtrain_fail_on_mixed_skips --gtest_filter=-${excluded})
  else()
    add_test(NAME ${A_NAME} COMMAND ${A_NAME} --dtrain_fail_on_mixed_skips)
  endif()
  set_tests_properties(${entries} PROPERTIES TIMEOUT ${A_TIMEOUT} SKIP_RETURN_CODE 77
                       ENVIRONMENT "DTRAIN_BIN_DIR=${CMAKE_BINARY_DIR}/bin;DTRAIN_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  if(A_LABELS)
    set_tests_properties(${entries} PROPERTIES LABELS "${A_LABELS}")
  endif()
  if(A_COST)
    set_tests_properties(${A_NAME} PROPERTIES COST ${A_COST})
  endif()
endfunction()

function(dtrain_flag_names)
  cmake_parse_arguments(A "" "NAME;FUNCTION" "SOURCES" ${ARGN})
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${A_NAME}.cc)
  add_custom_command(OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} "-DSOURCES=${A_SOURCES}" -DOUTPUT=${out} -DFUNCTION=${A_FUNCTION}
            -P ${PROJECT_SOURCE_DIR}/cmake/flag_names.cmake
    DEPENDS ${A_SOURCES} ${PROJECT_SOURCE_DIR}/cmake/flag_names.cmake
    COMMENT "Listing the flags of ${A_SOURCES}" VERBATIM)
  add_library(${A_NAME} STATIC ${out})
endfunction()
