#include "common/metrics/metrics_flags.h"

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "common/free_ports.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(std::string, metrics_bind_address);

namespace dtrain::metrics {
namespace {

using ::testing::HasSubstr;

TEST(MetricsFlagsTest, BadValuesAreRefusedNamingTheFlag) {
  absl::SetFlag(&FLAGS_metrics_bind_address, "127.0.0.1");
  EXPECT_TRUE(ValidateMetricsEndpointFlags(0).ok());
  absl::Status s = ValidateMetricsEndpointFlags(70000);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--metrics_port"));
  absl::SetFlag(&FLAGS_metrics_bind_address, "localhost");  // a host name, not an address
  s = ValidateMetricsEndpointFlags(9100);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--metrics_bind_address"));
  absl::SetFlag(&FLAGS_metrics_bind_address, "127.0.0.1");
}

TEST(MetricsFlagsTest, PortZeroStartsNothing) {
  absl::StatusOr<std::unique_ptr<MetricsExporter>> e = StartMetricsEndpoint(0);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(*e, nullptr);
}

TEST(MetricsFlagsTest, ServesOnTheBindAddressAndPort) {
  absl::SetFlag(&FLAGS_metrics_bind_address, "127.0.0.1");
  const std::vector<int> ports = FreePorts(1);
  ASSERT_EQ(ports.size(), 1u);
  absl::StatusOr<std::unique_ptr<MetricsExporter>> e = StartMetricsEndpoint(ports[0]);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_NE(*e, nullptr);
  EXPECT_EQ((*e)->port(), ports[0]);
  EXPECT_EQ((*e)->url(), "http://127.0.0.1:" + std::to_string(ports[0]) + "/metrics");
  // A second exporter on the same port fails (the port in use), as the binaries report it.
  absl::StatusOr<std::unique_ptr<MetricsExporter>> again = StartMetricsEndpoint(ports[0]);
  EXPECT_FALSE(again.ok());
}

}  // namespace
}  // namespace dtrain::metrics
