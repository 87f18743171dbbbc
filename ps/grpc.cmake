# The gRPC side of the ps (included from ps/CMakeLists.txt): wire format, service, client, server, binary.
dtrain_cc_library(NAME dtrain_ps_grpc
  SRCS wire_format.cc tensor_coding.cc upload_feeder.cc grpc_security.cc grpc_ps_service.cc grpc_ps_client.cc
       server.cc
  DEPS dtrain_ps_core dtrain_proto gRPC::grpc++ absl::status absl::statusor absl::strings absl::synchronization
       absl::time glog::glog)

dtrain_cc_binary(NAME dtrain_ps SRCS main.cc
  DEPS dtrain_ps_grpc dtrain_common absl::flags absl::flags_parse absl::flags_usage)

dtrain_cc_test(NAME grpc_ps_test SRCS grpc_ps_test.cc ps_test_util.cc DEPS dtrain_ps_grpc dtrain_ps_client TIMEOUT 180
  SKIPPABLE tls "GrpcPsTest.MutualTls")  # certificates are made with the openssl binary
dtrain_cc_test(NAME tensor_coding_test SRCS tensor_coding_test.cc DEPS dtrain_ps_grpc TIMEOUT 120)

# libFuzzer harness of the ps's request handling: wire bytes -> Status (built with -DDTRAIN_FUZZ=ON; scripts/fuzz.sh).
dtrain_fuzzer(NAME ps_request_fuzzer SRCS ps_request_fuzzer.cc ps_test_util.cc DEPS dtrain_ps_grpc dtrain_ps_client)
