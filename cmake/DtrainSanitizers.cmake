# Instrumented builds, each in its own build directory:
#
#   -DDTRAIN_SANITIZE=address,undefined   the whole build with AddressSanitizer + UndefinedBehaviorSanitizer
#                                         (gcc or clang); any UB report aborts the test. scripts/test.sh builds
#                                         the unit tests this way in build-asan/ (target dtrain_unit_tests).
#   -DDTRAIN_FUZZ=ON                      the libFuzzer harnesses (dtrain_fuzzer below), clang only, with
#                                         ASan + UBSan and FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION (readers
#                                         then accept bad checksums, see common/crc32c.h). scripts/fuzz.sh
#                                         builds them in build-fuzz/ (target dtrain_fuzzers) and runs them.
#
# Both turn the CUDA backend off (nvcc's host code is not instrumented).
set(DTRAIN_SANITIZE "" CACHE STRING "Sanitizers for the whole build, e.g. address,undefined (empty: none)")
option(DTRAIN_FUZZ "Build the libFuzzer harnesses (*_fuzzer) with ASan+UBSan; needs clang" OFF)

if(DTRAIN_FUZZ AND DTRAIN_SANITIZE)
  message(FATAL_ERROR "DTRAIN_FUZZ and DTRAIN_SANITIZE go in separate build directories")
endif()

if(DTRAIN_SANITIZE)
  add_compile_options(-fsanitize=${DTRAIN_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${DTRAIN_SANITIZE})
  set(DTRAIN_CUDA OFF)
  message(STATUS "dtrain: sanitizers ${DTRAIN_SANITIZE}")
endif()

if(DTRAIN_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "DTRAIN_FUZZ=ON needs clang (libFuzzer): configure with -DCMAKE_C_COMPILER=clang "
                        "-DCMAKE_CXX_COMPILER=clang++, or run scripts/fuzz.sh")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer -gline-tables-only
                      # DTRAIN_SIMD_LOOP's vectorize hint cannot be honoured under the sanitizers: not news
                      -Wno-pass-failed)
  add_compile_definitions(FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION)
  add_link_options(-fsanitize=address,undefined)
  set(DTRAIN_CUDA OFF)
  message(STATUS "dtrain: libFuzzer harnesses (ASan + UBSan)")
endif()

add_custom_target(dtrain_fuzzers)
add_custom_target(dtrain_unit_tests)

# dtrain_fuzzer(NAME name SRCS a_fuzzer.cc DEPS lib [SEEDS dir ...])
#
# A libFuzzer harness: SRCS define LLVMFuzzerTestOneInput (and may define LLVMFuzzerInitialize). Built only
# with DTRAIN_FUZZ=ON, as part of dtrain_fuzzers; glog output is silenced (fuzz/quiet_logging.cc), a CHECK
# failure still aborts. scripts/fuzz.sh runs every harness registered here, seeded from the SEEDS directories
# (relative to the calling CMakeLists.txt, checked in) and from <build>/fuzz/seeds/<name>/ (what
# dtrain_fuzz_seeds generates, fuzz/make_seeds.cc). One line adds a harness, e.g.
#
#   dtrain_fuzzer(NAME ps_request_fuzzer SRCS ps_request_fuzzer.cc DEPS dtrain_ps_grpc)
function(dtrain_fuzzer)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS;SEEDS" ${ARGN})
  if(NOT DTRAIN_FUZZ)
    return()
  endif()
  add_executable(${A_NAME} ${A_SRCS} ${PROJECT_SOURCE_DIR}/fuzz/quiet_logging.cc)
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS} glog::glog)
  target_link_options(${A_NAME} PRIVATE -fsanitize=fuzzer)
  target_compile_options(${A_NAME} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  add_dependencies(dtrain_fuzzers ${A_NAME})
  set(seeds "${CMAKE_BINARY_DIR}/fuzz/seeds/${A_NAME}")
  foreach(dir ${A_SEEDS})
    get_filename_component(dir "${dir}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    string(APPEND seeds ":${dir}")
  endforeach()
  set_property(GLOBAL APPEND PROPERTY DTRAIN_FUZZERS "${A_NAME} ${seeds}")
endfunction()

# Called once at the end of the top-level CMakeLists.txt: <build>/fuzzers.txt lists "<name> <seed dirs, ':'>"
# per harness, for scripts/fuzz.sh.
function(dtrain_write_fuzzer_manifest)
  get_property(fuzzers GLOBAL PROPERTY DTRAIN_FUZZERS)
  set(text "")
  foreach(line ${fuzzers})
    string(APPEND text "${line}\n")
  endforeach()
  file(WRITE "${CMAKE_BINARY_DIR}/fuzzers.txt" "${text}")
endfunction()
