#include "emulator/cm/messages.h"

#include <arpa/inet.h>

#include <algorithm>

#include <fmt/format.h>

namespace rdmaemu::cm {

namespace {

// The message part of a whole MAD, after InitMad wrote its header.
std::span<uint8_t> Body(MadBytes& mad) { return std::span<uint8_t>(mad).subspan(kMadHeaderBytes); }
std::span<const uint8_t> Body(std::span<const uint8_t> mad) { return mad.subspan(kMadHeaderBytes, kMessageBytes); }

template <size_t N>
void Put(std::span<uint8_t, N> field, std::span<const uint8_t> data) {
  std::copy_n(data.begin(), std::min(data.size(), field.size()), field.begin());
}

template <typename Span>
std::vector<uint8_t> Take(Span field) {
  return std::vector<uint8_t>(field.begin(), field.end());
}

// The IP header at the start of REQ/SIDR_REQ private data, then the user's.
template <size_t N>
void PutWithIp(std::span<uint8_t, N> field, const IpHeader& ip, std::span<const uint8_t> user) {
  CmaHeaderView h(field.first(kCmaHeaderBytes));
  h.set_cma_version(CmaHeaderView::kVersion);
  h.set_ip_version(4);
  h.set_port(ip.src_port);
  h.set_src_ipv4(ntohl(ip.src_ip));
  h.set_dst_ipv4(ntohl(ip.dst_ip));
  Put(field.subspan(kCmaHeaderBytes), user);
}

template <size_t N>
Result<IpHeader> TakeIp(std::span<const uint8_t, N> field, std::string_view what) {
  ConstCmaHeaderView h(field.first(kCmaHeaderBytes));
  if (h.cma_version() != ConstCmaHeaderView::kVersion) {
    return InvalidArgument(fmt::format("{}: RDMA CM header version {} (only 0 exists)", what, h.cma_version()));
  }
  if (h.ip_version() != 4) {
    return InvalidArgument(fmt::format("{}: IP version {} in the RDMA CM header (this device speaks IPv4 only)",
                                       what, h.ip_version()));
  }
  return IpHeader{h.port(), htonl(h.src_ipv4()), htonl(h.dst_ipv4())};
}

}  // namespace

MadBytes Encode(const Req& m, uint64_t tid) {
  MadBytes mad{};
  InitMad(mad, AttributeId::kReq, tid);
  ReqView v(Body(mad));
  v.set_local_comm_id(m.local_comm_id);
  v.set_service_id(m.service_id);
  v.set_local_ca_guid(m.ca_guid);
  v.set_local_qkey(0);
  v.set_local_qpn(m.qpn);
  v.set_responder_resources(m.responder_resources);
  v.set_initiator_depth(m.initiator_depth);
  v.set_remote_cm_response_timeout(m.remote_cm_response_timeout);
  v.set_transport_service_type(m.transport);
  v.set_end_to_end_flow_control(m.flow_control);
  v.set_starting_psn(m.starting_psn);
  v.set_local_cm_response_timeout(m.local_cm_response_timeout);
  v.set_retry_count(m.retry_count);
  v.set_partition_key(m.pkey);
  v.set_path_mtu(m.path_mtu);
  v.set_rnr_retry_count(m.rnr_retry_count);
  v.set_max_cm_retries(m.max_cm_retries);
  v.set_srq(m.srq);
  v.set_extended_transport_type(m.extended_transport);
  auto path = v.primary_path();
  // Off the local subnet (hop limit > 1) the LIDs are the permissive LID,
  // as the kernel's CM writes them for RoCE v2.
  path.set_local_lid(0xffff);
  path.set_remote_lid(0xffff);
  path.set_local_gid(m.local_gid);
  path.set_remote_gid(m.remote_gid);
  path.set_traffic_class(m.traffic_class);
  path.set_hop_limit(m.hop_limit);
  path.set_subnet_local(m.hop_limit <= 1);
  path.set_local_ack_timeout(m.local_ack_timeout);
  PutWithIp(v.private_data(), m.ip, m.private_data);
  return mad;
}

MadBytes Encode(const Rep& m, uint64_t tid) {
  MadBytes mad{};
  InitMad(mad, AttributeId::kRep, tid);
  RepView v(Body(mad));
  v.set_local_comm_id(m.local_comm_id);
  v.set_remote_comm_id(m.remote_comm_id);
  v.set_local_qkey(m.qkey);
  v.set_local_qpn(m.qpn);
  v.set_local_eecn(m.eecn);
  v.set_starting_psn(m.starting_psn);
  v.set_responder_resources(m.responder_resources);
  v.set_initiator_depth(m.initiator_depth);
  v.set_target_ack_delay(m.target_ack_delay);
  v.set_end_to_end_flow_control(m.flow_control);
  v.set_rnr_retry_count(m.rnr_retry_count);
  v.set_srq(m.srq);
  v.set_local_ca_guid(m.ca_guid);
  Put(v.private_data(), m.private_data);
  return mad;
}

namespace {
MadBytes EncodeCommIds(AttributeId id, const CommIds& m, uint64_t tid) {
  MadBytes mad{};
  InitMad(mad, id, tid);
  RtuView v(Body(mad));
  v.set_local_comm_id(m.local_comm_id);
  v.set_remote_comm_id(m.remote_comm_id);
  return mad;
}
}  // namespace

MadBytes EncodeRtu(const CommIds& m, uint64_t tid) { return EncodeCommIds(AttributeId::kRtu, m, tid); }
MadBytes EncodeDrep(const CommIds& m, uint64_t tid) { return EncodeCommIds(AttributeId::kDrep, m, tid); }

MadBytes Encode(const Dreq& m, uint64_t tid) {
  MadBytes mad{};
  InitMad(mad, AttributeId::kDreq, tid);
  DreqView v(Body(mad));
  v.set_local_comm_id(m.local_comm_id);
  v.set_remote_comm_id(m.remote_comm_id);
  v.set_remote_qpn_eecn(m.remote_qpn);
  return mad;
}

MadBytes Encode(const Rej& m, uint64_t tid) {
  MadBytes mad{};
  InitMad(mad, AttributeId::kRej, tid);
  RejView v(Body(mad));
  v.set_local_comm_id(m.local_comm_id);
  v.set_remote_comm_id(m.remote_comm_id);
  v.set_message_rejected(m.message_rejected);
  v.set_reason(m.reason);
  Put(v.private_data(), m.private_data);
  return mad;
}

MadBytes Encode(const Mra& m, uint64_t tid) {
  MadBytes mad{};
  InitMad(mad, AttributeId::kMra, tid);
  MraView v(Body(mad));
  v.set_local_comm_id(m.local_comm_id);
  v.set_remote_comm_id(m.remote_comm_id);
  v.set_message_mraed(m.message_mraed);
  v.set_service_timeout(m.service_timeout);
  return mad;
}

MadBytes Encode(const SidrReq& m, uint64_t tid) {
  MadBytes mad{};
  InitMad(mad, AttributeId::kSidrReq, tid);
  SidrReqView v(Body(mad));
  v.set_request_id(m.request_id);
  v.set_partition_key(m.pkey);
  v.set_service_id(m.service_id);
  PutWithIp(v.private_data(), m.ip, m.private_data);
  return mad;
}

MadBytes Encode(const SidrRep& m, uint64_t tid) {
  MadBytes mad{};
  InitMad(mad, AttributeId::kSidrRep, tid);
  SidrRepView v(Body(mad));
  v.set_request_id(m.request_id);
  v.set_status(m.status);
  v.set_qpn(m.qpn);
  v.set_service_id(m.service_id);
  v.set_qkey(m.qkey);
  Put(v.private_data(), m.private_data);
  return mad;
}

Result<MadHead> DecodeHead(std::span<const uint8_t> mad) {
  auto kind = CheckMad(mad);
  if (!kind.ok()) return kind.status();
  return MadHead{*kind, ConstMadHeaderView(mad.first(kMadHeaderBytes)).transaction_id()};
}

Result<Req> DecodeReq(std::span<const uint8_t> mad) {
  ConstReqView v(Body(mad));
  Req m;
  m.local_comm_id = v.local_comm_id();
  m.service_id = v.service_id();
  m.ca_guid = v.local_ca_guid();
  m.qpn = v.local_qpn();
  m.responder_resources = v.responder_resources();
  m.initiator_depth = v.initiator_depth();
  m.remote_cm_response_timeout = v.remote_cm_response_timeout();
  m.transport = v.transport_service_type();
  m.flow_control = v.end_to_end_flow_control();
  m.starting_psn = v.starting_psn();
  m.local_cm_response_timeout = v.local_cm_response_timeout();
  m.retry_count = v.retry_count();
  m.pkey = v.partition_key();
  m.path_mtu = v.path_mtu();
  m.rnr_retry_count = v.rnr_retry_count();
  m.max_cm_retries = v.max_cm_retries();
  m.srq = v.srq();
  m.extended_transport = v.extended_transport_type();
  auto path = v.primary_path();
  m.local_gid = path.local_gid();
  m.remote_gid = path.remote_gid();
  m.traffic_class = path.traffic_class();
  m.hop_limit = path.hop_limit();
  m.local_ack_timeout = path.local_ack_timeout();
  if (m.local_comm_id == 0) return InvalidArgument("REQ with local comm ID 0");
  if (m.path_mtu < 1 || m.path_mtu > 5) return InvalidArgument(fmt::format("REQ with path MTU code {}", m.path_mtu));
  auto ip = TakeIp(v.private_data(), "REQ");
  if (!ip.ok()) return ip.status();
  m.ip = *ip;
  m.private_data = Take(v.private_data().subspan(kCmaHeaderBytes));
  return m;
}

Rep DecodeRep(std::span<const uint8_t> mad) {
  ConstRepView v(Body(mad));
  Rep m;
  m.local_comm_id = v.local_comm_id();
  m.remote_comm_id = v.remote_comm_id();
  m.qkey = v.local_qkey();
  m.qpn = v.local_qpn();
  m.eecn = v.local_eecn();
  m.starting_psn = v.starting_psn();
  m.responder_resources = v.responder_resources();
  m.initiator_depth = v.initiator_depth();
  m.target_ack_delay = v.target_ack_delay();
  m.flow_control = v.end_to_end_flow_control();
  m.rnr_retry_count = v.rnr_retry_count();
  m.srq = v.srq();
  m.ca_guid = v.local_ca_guid();
  m.private_data = Take(v.private_data());
  return m;
}

CommIds DecodeCommIds(std::span<const uint8_t> mad) {
  ConstRtuView v(Body(mad));
  return {v.local_comm_id(), v.remote_comm_id()};
}

Dreq DecodeDreq(std::span<const uint8_t> mad) {
  ConstDreqView v(Body(mad));
  return {v.local_comm_id(), v.remote_comm_id(), v.remote_qpn_eecn()};
}

Rej DecodeRej(std::span<const uint8_t> mad) {
  ConstRejView v(Body(mad));
  return {v.local_comm_id(), v.remote_comm_id(), v.message_rejected(), v.reason(), Take(v.private_data())};
}

Mra DecodeMra(std::span<const uint8_t> mad) {
  ConstMraView v(Body(mad));
  return {v.local_comm_id(), v.remote_comm_id(), v.message_mraed(), v.service_timeout()};
}

Result<SidrReq> DecodeSidrReq(std::span<const uint8_t> mad) {
  ConstSidrReqView v(Body(mad));
  SidrReq m;
  m.request_id = v.request_id();
  m.pkey = v.partition_key();
  m.service_id = v.service_id();
  auto ip = TakeIp(v.private_data(), "SIDR_REQ");
  if (!ip.ok()) return ip.status();
  m.ip = *ip;
  m.private_data = Take(v.private_data().subspan(kCmaHeaderBytes));
  return m;
}

SidrRep DecodeSidrRep(std::span<const uint8_t> mad) {
  ConstSidrRepView v(Body(mad));
  return {v.request_id(), v.status(), v.qpn(), v.service_id(), v.qkey(), Take(v.private_data())};
}

}  // namespace rdmaemu::cm
