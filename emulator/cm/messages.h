// The IB CM messages as values, and their 256-byte MADs (mad.h's views).
//
// The manager thinks in these structs; Encode/Decode are the only code that
// knows where a field sits. Only what a RoCE v2 connection uses is here: no
// alternate path (RoCE has no APM in the CM), no RD, no LAP/APR.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "emulator/base/status.h"
#include "emulator/cm/mad.h"

namespace rdmaemu::cm {

using MadBytes = std::array<uint8_t, 256>;
using GidBytes = Gid;

// The 36-byte header rdma_cm puts before the user's private data of a REQ
// or SIDR_REQ: which IP endpoints the connection is between.
struct IpHeader {
  uint16_t src_port = 0;  // the active side's port (host order)
  uint32_t src_ip = 0;    // network order
  uint32_t dst_ip = 0;    // network order
};

struct Req {
  uint32_t local_comm_id = 0;
  uint64_t service_id = 0;
  uint64_t ca_guid = 0;
  uint32_t qpn = 0;
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t remote_cm_response_timeout = 0;
  uint8_t transport = 0;           // TransportServiceType: 0 RC, 1 UC, 3 XRC
  uint8_t extended_transport = 0;  // 1 with transport 3: XRC
  bool flow_control = false;
  uint32_t starting_psn = 0;
  uint8_t local_cm_response_timeout = 0;
  uint8_t retry_count = 0;
  uint16_t pkey = 0xffff;
  uint8_t path_mtu = 0;  // IB enum: 1 = 256 .. 5 = 4096
  uint8_t rnr_retry_count = 0;
  uint8_t max_cm_retries = 0;
  bool srq = false;
  GidBytes local_gid{};
  GidBytes remote_gid{};
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;
  uint8_t local_ack_timeout = 0;
  IpHeader ip;
  std::vector<uint8_t> private_data;  // the user's, after the IP header (56 on decode)
};

struct Rep {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t qkey = 0;
  uint32_t qpn = 0;
  uint32_t eecn = 0;  // an XRC target's QPN travels here (its local QPN is 0)
  uint32_t starting_psn = 0;
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t target_ack_delay = 0;
  bool flow_control = false;
  uint8_t rnr_retry_count = 0;
  bool srq = false;
  uint64_t ca_guid = 0;
  std::vector<uint8_t> private_data;  // 196 on decode
};

// RTU, DREP: the two comm IDs (their private data is not exposed by rdma_cm).
struct CommIds {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
};

struct Dreq {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t remote_qpn = 0;
};

struct Rej {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint8_t message_rejected = 0;  // 0 REQ, 1 REP, 2 other
  uint16_t reason = 0;
  std::vector<uint8_t> private_data;  // 148 on decode
};

struct Mra {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint8_t message_mraed = 0;  // 0 REQ, 1 REP, 2 other
  uint8_t service_timeout = 0;
};

struct SidrReq {
  uint32_t request_id = 0;
  uint16_t pkey = 0xffff;
  uint64_t service_id = 0;
  IpHeader ip;
  std::vector<uint8_t> private_data;  // the user's (180 on decode)
};

struct SidrRep {
  uint32_t request_id = 0;
  uint8_t status = 0;
  uint32_t qpn = 0;
  uint64_t service_id = 0;
  uint32_t qkey = 0;
  std::vector<uint8_t> private_data;  // 136 on decode
};

// Message kinds are the MAD's AttributeID.
using Kind = AttributeId;

// Each Encode writes a whole MAD (header with `tid`, then the message);
// private data longer than the message carries is cut (callers check).
MadBytes Encode(const Req& m, uint64_t tid);
MadBytes Encode(const Rep& m, uint64_t tid);
MadBytes EncodeRtu(const CommIds& m, uint64_t tid);
MadBytes EncodeDrep(const CommIds& m, uint64_t tid);
MadBytes Encode(const Dreq& m, uint64_t tid);
MadBytes Encode(const Rej& m, uint64_t tid);
MadBytes Encode(const Mra& m, uint64_t tid);
MadBytes Encode(const SidrReq& m, uint64_t tid);
MadBytes Encode(const SidrRep& m, uint64_t tid);

// A received MAD: checks the header (a CM Send MAD of a known attribute)
// and gives its kind and transaction ID. EINVAL says what is wrong.
struct MadHead {
  Kind kind;
  uint64_t tid;
};
Result<MadHead> DecodeHead(std::span<const uint8_t> mad);
// Decoding a message whose kind DecodeHead gave; EINVAL for a malformed one
// (a REQ/SIDR_REQ whose IP header is not version 0 / IPv4).
Result<Req> DecodeReq(std::span<const uint8_t> mad);
Rep DecodeRep(std::span<const uint8_t> mad);
CommIds DecodeCommIds(std::span<const uint8_t> mad);  // RTU, DREP
Dreq DecodeDreq(std::span<const uint8_t> mad);
Rej DecodeRej(std::span<const uint8_t> mad);
Mra DecodeMra(std::span<const uint8_t> mad);
Result<SidrReq> DecodeSidrReq(std::span<const uint8_t> mad);
SidrRep DecodeSidrRep(std::span<const uint8_t> mad);

}  // namespace rdmaemu::cm
