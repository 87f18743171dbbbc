# Small helpers in the spirit of Bazel's cc_library / cc_test / cc_binary.
#
#   dtrain_cc_library(NAME name SRCS a.cc b.cc DEPS lib1 lib2 [PUBLIC_DEPS ...])
#   dtrain_cc_test(NAME name SRCS a_test.cc DEPS lib [LABELS slow] [TIMEOUT 120])
#   dtrain_cc_binary(NAME name SRCS main.cc DEPS lib)
include(GoogleTest)

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

# Each test binary is registered with ctest as a whole (one ctest entry per binary) so that
# process-level timeouts apply. Binaries may exit 77 to report "skipped" (e.g. no GPU).
function(dtrain_cc_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${A_NAME} ${A_SRCS})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_options(${A_NAME} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  add_test(NAME ${A_NAME} COMMAND ${A_NAME})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  set_tests_properties(${A_NAME} PROPERTIES TIMEOUT ${A_TIMEOUT} SKIP_RETURN_CODE 77
                       ENVIRONMENT "DTRAIN_BIN_DIR=${CMAKE_BINARY_DIR}/bin;DTRAIN_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  if(A_LABELS)
    set_tests_properties(${A_NAME} PROPERTIES LABELS "${A_LABELS}")
  endif()
endfunction()
