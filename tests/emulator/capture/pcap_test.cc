#include "emulator/capture/pcap.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "emulator/base/endian.h"
#include "emulator/capture/capture.h"

namespace rdmaemu::capture {
namespace {

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

uint32_t Le32(const uint8_t* p) { return LoadLe32(p); }
uint16_t Le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

TEST(Ipv4Checksum, KnownHeader) {
  // The usual textbook header (192.168.0.1 -> 192.168.0.199, UDP), whose
  // checksum is 0xb861.
  uint8_t h[20] = {0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
                   0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7};
  EXPECT_EQ(Ipv4Checksum(h), 0xb861);
  h[10] = 0xb8;
  h[11] = 0x61;
  EXPECT_EQ(Ipv4Checksum(h), 0) << "a header with its checksum sums to zero";
}

TEST(WriteFrameHeader, Layout) {
  uint8_t f[kFrameHeaderBytes];
  Endpoints e{0x7f000001, 0x7f000002, 4791, 4791};
  WriteFrameHeader(e, 100, 0x1234, f);
  // Ethernet: destination MAC, source MAC, IPv4 ethertype.
  const uint8_t dst_mac[6] = {0x02, 0x00, 127, 0, 0, 2};
  const uint8_t src_mac[6] = {0x02, 0x00, 127, 0, 0, 1};
  EXPECT_EQ(0, memcmp(f, dst_mac, 6));
  EXPECT_EQ(0, memcmp(f + 6, src_mac, 6));
  EXPECT_EQ(LoadBe16(f + 12), 0x0800);
  const uint8_t* ip = f + kEthernetBytes;
  EXPECT_EQ(ip[0], 0x45);
  EXPECT_EQ(ip[1], 0);
  EXPECT_EQ(LoadBe16(ip + 2), 20 + 8 + 100);
  EXPECT_EQ(LoadBe16(ip + 4), 0x1234);
  EXPECT_EQ(LoadBe16(ip + 6), 0x4000);
  EXPECT_EQ(ip[8], 64);
  EXPECT_EQ(ip[9], 17);
  EXPECT_EQ(LoadBe32(ip + 12), 0x7f000001u);
  EXPECT_EQ(LoadBe32(ip + 16), 0x7f000002u);
  EXPECT_EQ(Ipv4Checksum(std::span<const uint8_t>(ip, 20)), 0) << "the IPv4 checksum is correct";
  EXPECT_NE(LoadBe16(ip + 10), 0);
  const uint8_t* udp = ip + kIpv4Bytes;
  EXPECT_EQ(LoadBe16(udp), 4791);
  EXPECT_EQ(LoadBe16(udp + 2), 4791);
  EXPECT_EQ(LoadBe16(udp + 4), 8 + 100);
  EXPECT_EQ(LoadBe16(udp + 6), 0);
}

TEST(WriteFrameHeader, PortsAndChecksumFollowTheDatagram) {
  uint8_t a[kFrameHeaderBytes], b[kFrameHeaderBytes];
  WriteFrameHeader({0x0a000005, 0x0a000006, 50000, 4791}, 60, 1, a);
  WriteFrameHeader({0x0a000005, 0x0a000006, 50000, 4791}, 61, 1, b);
  EXPECT_EQ(LoadBe16(a + 34), 50000);
  EXPECT_EQ(LoadBe16(a + 36), 4791);
  EXPECT_NE(LoadBe16(a + 24), LoadBe16(b + 24)) << "the checksum covers the total length";
  EXPECT_EQ(Ipv4Checksum(std::span<const uint8_t>(b + 14, 20)), 0);
}

TEST(ExpandPath, Pid) {
  EXPECT_EQ(ExpandPath("/tmp/cap-%p.pcap", 4242), "/tmp/cap-4242.pcap");
  EXPECT_EQ(ExpandPath("%p-%p", 7), "7-7");
  EXPECT_EQ(ExpandPath("100%%-%q%", 7), "100%-%q%");
  EXPECT_EQ(ExpandPath("plain", 7), "plain");
}

TEST(PcapWriter, FileHeaderAndRecords) {
  const std::string path = TempPath("records.pcap");
  auto w = PcapWriter::Open(path);
  ASSERT_TRUE(w.ok()) << w.status().message();
  const std::vector<uint8_t> p1 = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<uint8_t> p2(300, 0xab);
  (*w)->Record({0x7f000001, 0x7f000002, 4791, 4791}, p1);
  (*w)->Record({0x7f000002, 0x7f000001, 4791, 4791}, p2);
  EXPECT_EQ((*w)->packets(), 2u);
  EXPECT_TRUE((*w)->HasPending()) << "records are buffered, not written one by one";
  EXPECT_EQ(ReadFile(path).size(), kFileHeaderBytes);
  ASSERT_TRUE((*w)->Flush().ok());
  EXPECT_FALSE((*w)->HasPending());

  auto f = ReadFile(path);
  ASSERT_EQ(f.size(), kFileHeaderBytes + 2 * (kRecordHeaderBytes + kFrameHeaderBytes) + p1.size() +
                          p2.size());
  EXPECT_EQ(Le32(f.data()), 0xa1b2c3d4u);
  EXPECT_EQ(f[0], 0xd4) << "little-endian";
  EXPECT_EQ(Le16(f.data() + 4), 2);
  EXPECT_EQ(Le16(f.data() + 6), 4);
  EXPECT_EQ(Le32(f.data() + 8), 0u);
  EXPECT_EQ(Le32(f.data() + 12), 0u);
  EXPECT_EQ(Le32(f.data() + 16), kSnapLen);
  EXPECT_EQ(Le32(f.data() + 20), kLinktypeEthernet);

  const uint8_t* r = f.data() + kFileHeaderBytes;
  EXPECT_GT(Le32(r), 1700000000u) << "seconds since the epoch";
  EXPECT_LT(Le32(r + 4), 1000000u) << "microseconds";
  EXPECT_EQ(Le32(r + 8), kFrameHeaderBytes + p1.size());
  EXPECT_EQ(Le32(r + 12), kFrameHeaderBytes + p1.size());
  uint8_t want[kFrameHeaderBytes];
  WriteFrameHeader({0x7f000001, 0x7f000002, 4791, 4791}, p1.size(), 0, want);
  EXPECT_EQ(0, memcmp(r + kRecordHeaderBytes, want, kFrameHeaderBytes));
  EXPECT_EQ(0, memcmp(r + kRecordHeaderBytes + kFrameHeaderBytes, p1.data(), p1.size()))
      << "the UDP payload, ICRC included, is recorded unchanged";

  const uint8_t* r2 = r + kRecordHeaderBytes + kFrameHeaderBytes + p1.size();
  EXPECT_EQ(Le32(r2 + 8), kFrameHeaderBytes + p2.size());
  const uint8_t* ip2 = r2 + kRecordHeaderBytes + kEthernetBytes;
  EXPECT_EQ(LoadBe32(ip2 + 12), 0x7f000002u) << "the second packet goes the other way";
  EXPECT_EQ(LoadBe16(ip2 + 4), 1) << "IPv4 identification counts up";
  EXPECT_GE(Le32(r2) * 1000000ull + Le32(r2 + 4), Le32(r) * 1000000ull + Le32(r + 4));
}

TEST(PcapWriter, DestructionFlushes) {
  const std::string path = TempPath("destroy.pcap");
  {
    auto w = PcapWriter::Open(path);
    ASSERT_TRUE(w.ok());
    (*w)->Record({1, 2, 3, 4}, std::vector<uint8_t>(40, 1));
  }
  EXPECT_EQ(ReadFile(path).size(), kFileHeaderBytes + kRecordHeaderBytes + kFrameHeaderBytes + 40);
}

TEST(PcapWriter, LargeVolumeWritesWithoutFlush) {
  const std::string path = TempPath("volume.pcap");
  auto w = PcapWriter::Open(path);
  ASSERT_TRUE(w.ok());
  const std::vector<uint8_t> p(4136, 7);
  for (int i = 0; i < 200; ++i) (*w)->Record({1, 2, 3, 4}, p);
  EXPECT_GT(ReadFile(path).size(), 200u * 1024) << "a full buffer is written by itself";
}

TEST(PcapWriter, BadPathNamesTheFileAndTheReason) {
  auto w = PcapWriter::Open("/nonexistent-dir/x-%p.pcap");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), ENOENT);
  EXPECT_NE(w.status().message().find("/nonexistent-dir/x-" + std::to_string(getpid()) + ".pcap"),
            std::string::npos)
      << w.status().message();
  EXPECT_NE(w.status().message().find("No such file or directory"), std::string::npos);
  EXPECT_FALSE(PcapWriter::Open("").ok());
}

TEST(Capture, StartRecordStop) {
  const std::string path = TempPath("process-%p.pcap");
  EXPECT_FALSE(Active());
  EXPECT_EQ(Stop().status().code(), ENOENT);
  Record({1, 2, 3, 4}, std::vector<uint8_t>(12, 1));  // nothing runs: ignored
  ASSERT_TRUE(Start(path).ok());
  EXPECT_TRUE(Active());
  EXPECT_EQ(Start(path).code(), EBUSY);
  Record({1, 2, 3, 4}, std::vector<uint8_t>(12, 1));
  Record({1, 2, 3, 4}, std::vector<uint8_t>(16, 1));
  auto stopped = Stop();
  ASSERT_TRUE(stopped.ok());
  EXPECT_FALSE(Active());
  EXPECT_EQ(stopped->packets, 2u);
  EXPECT_EQ(stopped->path, ExpandPath(path, getpid()));
  EXPECT_EQ(ReadFile(stopped->path).size(),
            kFileHeaderBytes + 2 * (kRecordHeaderBytes + kFrameHeaderBytes) + 28);
}

}  // namespace
}  // namespace rdmaemu::capture
