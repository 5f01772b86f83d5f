// rdma_event_str (verbs/rdmacm/strings.cc): each event type is its enumerator's
// name and any other value "UNKNOWN EVENT", as rdma-core 44 says; and the same
// text as Debian's librdmacm.so.1 for every value, where it is installed
// (dlopen'ed privately, never linked; it calls nothing to name an event).

#include <dlfcn.h>
#include <rdma/rdma_cma.h>

#include "gtest/gtest.h"

namespace {

constexpr const char* kRealLibrdmacm = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";

TEST(EventStr, EveryEventIsItsEnumeratorsName) {
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_ADDR_RESOLVED), "RDMA_CM_EVENT_ADDR_RESOLVED");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_ADDR_ERROR), "RDMA_CM_EVENT_ADDR_ERROR");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_ROUTE_RESOLVED), "RDMA_CM_EVENT_ROUTE_RESOLVED");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_ROUTE_ERROR), "RDMA_CM_EVENT_ROUTE_ERROR");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_CONNECT_REQUEST), "RDMA_CM_EVENT_CONNECT_REQUEST");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_CONNECT_RESPONSE), "RDMA_CM_EVENT_CONNECT_RESPONSE");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_CONNECT_ERROR), "RDMA_CM_EVENT_CONNECT_ERROR");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_UNREACHABLE), "RDMA_CM_EVENT_UNREACHABLE");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_REJECTED), "RDMA_CM_EVENT_REJECTED");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_DISCONNECTED), "RDMA_CM_EVENT_DISCONNECTED");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_DEVICE_REMOVAL), "RDMA_CM_EVENT_DEVICE_REMOVAL");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_MULTICAST_JOIN), "RDMA_CM_EVENT_MULTICAST_JOIN");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_MULTICAST_ERROR), "RDMA_CM_EVENT_MULTICAST_ERROR");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_ADDR_CHANGE), "RDMA_CM_EVENT_ADDR_CHANGE");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_TIMEWAIT_EXIT), "RDMA_CM_EVENT_TIMEWAIT_EXIT");
}

TEST(EventStr, OtherValuesAreUnknown) {
  EXPECT_STREQ(rdma_event_str(static_cast<rdma_cm_event_type>(16)), "UNKNOWN EVENT");
  EXPECT_STREQ(rdma_event_str(static_cast<rdma_cm_event_type>(-1)), "UNKNOWN EVENT");
  EXPECT_STREQ(rdma_event_str(static_cast<rdma_cm_event_type>(1000)), "UNKNOWN EVENT");
}

TEST(EventStr, SameAsDebiansLibrdmacm) {
  void* real = dlopen(kRealLibrdmacm, RTLD_NOW | RTLD_LOCAL);
  if (real == nullptr) GTEST_SKIP() << kRealLibrdmacm << " not loadable: " << dlerror();
  auto* real_str = reinterpret_cast<decltype(&rdma_event_str)>(dlsym(real, "rdma_event_str"));
  ASSERT_NE(real_str, nullptr);
  for (int v = -2; v <= 20; ++v) {
    const auto event = static_cast<rdma_cm_event_type>(v);
    EXPECT_STREQ(rdma_event_str(event), real_str(event)) << "event " << v;
  }
  dlclose(real);
}

}  // namespace
