// Flow steering: ibv_create_flow and ibv_destroy_flow on raw packet QPs.
// The specs (verbs.h's ibv_flow_spec_*, network byte order) become an
// emulator flow::Rule (host order) the engine steers received frames by.
//
// As the kernel judges them: a malformed attribute or spec is EINVAL; a
// well-formed request for what the device lacks (tunnels, actions, egress,
// inner headers, flows on other QP types) is EOPNOTSUPP with a line saying
// what, so that pyverbs and applications can tell "wrong" from "absent".
#include <arpa/inet.h>

#include <cstring>

#include <fmt/format.h>

#include "emulator/base/log.h"
#include "emulator/flow/rule.h"
#include "provider/check/quarantine.h"
#include "provider/handles.h"
#include "provider/objects.h"
#include "provider/ops.h"

namespace rdmaemu::provider {
namespace {

// More specs than any header stack this device parses could use.
constexpr uint32_t kMaxSpecs = 8;
constexpr uint32_t kKnownFlags = IBV_FLOW_ATTR_FLAGS_DONT_TRAP | IBV_FLOW_ATTR_FLAGS_EGRESS;

struct Flow {
  ibv_flow ibv;  // must be first
  uint64_t id = 0;
  Qp* qp = nullptr;
};

Status Refuse(int code, std::string why) {
  Log().warn("ibv_create_flow: {}", why);
  return Status::Error(code, std::move(why));
}

wire::MacAddress Mac(const uint8_t* bytes) {
  wire::MacAddress m;
  std::memcpy(m.data(), bytes, m.size());
  return m;
}

std::array<uint8_t, 16> Ip6(const uint8_t* bytes) {
  std::array<uint8_t, 16> a;
  std::memcpy(a.data(), bytes, a.size());
  return a;
}

// Each layer once: a second spec for a layer the rule has is EINVAL.
Status Once(bool taken, const char* layer) {
  if (!taken) return Status::Ok();
  return Refuse(EINVAL, fmt::format("two {} specs in one rule", layer));
}

// Reads one spec into `m`. `size` is what the spec says it is; it must be
// exactly its type's struct (the caller has checked it lies within the
// attribute's bytes).
Status ReadSpec(const uint8_t* p, uint32_t type, uint16_t size, flow::Match& m) {
  auto need = [&](size_t want, const char* name) -> Status {
    if (size == want) return Status::Ok();
    return Refuse(EINVAL, fmt::format("{} spec of size {} (it is {} bytes)", name, size, want));
  };
  switch (type) {
    case IBV_FLOW_SPEC_ETH: {
      if (Status s = need(sizeof(ibv_flow_spec_eth), "IBV_FLOW_SPEC_ETH"); !s.ok()) return s;
      if (Status s = Once(m.eth.has_value(), "Ethernet"); !s.ok()) return s;
      ibv_flow_spec_eth spec;
      std::memcpy(&spec, p, sizeof spec);
      flow::EthMatch e;
      e.dst = Mac(spec.val.dst_mac);
      e.dst_mask = Mac(spec.mask.dst_mac);
      e.src = Mac(spec.val.src_mac);
      e.src_mask = Mac(spec.mask.src_mac);
      e.ether_type = ntohs(spec.val.ether_type);
      e.ether_type_mask = ntohs(spec.mask.ether_type);
      e.vlan_tag = ntohs(spec.val.vlan_tag);
      e.vlan_tag_mask = ntohs(spec.mask.vlan_tag);
      m.eth = e;
      return Status::Ok();
    }
    case IBV_FLOW_SPEC_IPV4:
    case IBV_FLOW_SPEC_IPV4_EXT: {
      const bool ext = type == IBV_FLOW_SPEC_IPV4_EXT;
      if (Status s = need(ext ? sizeof(ibv_flow_spec_ipv4_ext) : sizeof(ibv_flow_spec_ipv4),
                          ext ? "IBV_FLOW_SPEC_IPV4_EXT" : "IBV_FLOW_SPEC_IPV4");
          !s.ok()) {
        return s;
      }
      if (Status s = Once(m.ipv4.has_value() || m.ipv6.has_value(), "IP"); !s.ok()) return s;
      flow::Ipv4Match ip;
      if (ext) {
        ibv_flow_spec_ipv4_ext spec;
        std::memcpy(&spec, p, sizeof spec);
        ip.src = ntohl(spec.val.src_ip);
        ip.src_mask = ntohl(spec.mask.src_ip);
        ip.dst = ntohl(spec.val.dst_ip);
        ip.dst_mask = ntohl(spec.mask.dst_ip);
        ip.proto = spec.val.proto;
        ip.proto_mask = spec.mask.proto;
        ip.tos = spec.val.tos;
        ip.tos_mask = spec.mask.tos;
        ip.ttl = spec.val.ttl;
        ip.ttl_mask = spec.mask.ttl;
        ip.flags = spec.val.flags;
        ip.flags_mask = spec.mask.flags;
      } else {
        ibv_flow_spec_ipv4 spec;
        std::memcpy(&spec, p, sizeof spec);
        ip.src = ntohl(spec.val.src_ip);
        ip.src_mask = ntohl(spec.mask.src_ip);
        ip.dst = ntohl(spec.val.dst_ip);
        ip.dst_mask = ntohl(spec.mask.dst_ip);
      }
      m.ipv4 = ip;
      return Status::Ok();
    }
    case IBV_FLOW_SPEC_IPV6: {
      if (Status s = need(sizeof(ibv_flow_spec_ipv6), "IBV_FLOW_SPEC_IPV6"); !s.ok()) return s;
      if (Status s = Once(m.ipv4.has_value() || m.ipv6.has_value(), "IP"); !s.ok()) return s;
      ibv_flow_spec_ipv6 spec;
      std::memcpy(&spec, p, sizeof spec);
      flow::Ipv6Match ip;
      ip.src = Ip6(spec.val.src_ip);
      ip.src_mask = Ip6(spec.mask.src_ip);
      ip.dst = Ip6(spec.val.dst_ip);
      ip.dst_mask = Ip6(spec.mask.dst_ip);
      ip.flow_label = ntohl(spec.val.flow_label);
      ip.flow_label_mask = ntohl(spec.mask.flow_label);
      ip.next_hdr = spec.val.next_hdr;
      ip.next_hdr_mask = spec.mask.next_hdr;
      ip.traffic_class = spec.val.traffic_class;
      ip.traffic_class_mask = spec.mask.traffic_class;
      ip.hop_limit = spec.val.hop_limit;
      ip.hop_limit_mask = spec.mask.hop_limit;
      m.ipv6 = ip;
      return Status::Ok();
    }
    case IBV_FLOW_SPEC_TCP:
    case IBV_FLOW_SPEC_UDP: {
      const bool tcp = type == IBV_FLOW_SPEC_TCP;
      if (Status s = need(sizeof(ibv_flow_spec_tcp_udp),
                          tcp ? "IBV_FLOW_SPEC_TCP" : "IBV_FLOW_SPEC_UDP");
          !s.ok()) {
        return s;
      }
      if (Status s = Once(m.l4.has_value(), "TCP/UDP"); !s.ok()) return s;
      ibv_flow_spec_tcp_udp spec;
      std::memcpy(&spec, p, sizeof spec);
      flow::L4Match l4;
      l4.proto = tcp ? wire::kIpProtoTcp : wire::kIpProtoUdp;
      l4.src_port = ntohs(spec.val.src_port);
      l4.src_port_mask = ntohs(spec.mask.src_port);
      l4.dst_port = ntohs(spec.val.dst_port);
      l4.dst_port_mask = ntohs(spec.mask.dst_port);
      m.l4 = l4;
      return Status::Ok();
    }
    default:
      break;
  }
  // Known to verbs.h but not to this device: tunnels, ESP, MPLS, inner
  // headers, actions (tag, drop, handle, count).
  const char* name = nullptr;
  switch (type & ~uint32_t{IBV_FLOW_SPEC_INNER}) {
    case IBV_FLOW_SPEC_ETH:
    case IBV_FLOW_SPEC_IPV4:
    case IBV_FLOW_SPEC_IPV4_EXT:
    case IBV_FLOW_SPEC_IPV6:
    case IBV_FLOW_SPEC_TCP:
    case IBV_FLOW_SPEC_UDP: name = "an inner-header spec (IBV_FLOW_SPEC_INNER)"; break;
    case IBV_FLOW_SPEC_ESP: name = "IBV_FLOW_SPEC_ESP"; break;
    case IBV_FLOW_SPEC_VXLAN_TUNNEL: name = "IBV_FLOW_SPEC_VXLAN_TUNNEL"; break;
    case IBV_FLOW_SPEC_GRE: name = "IBV_FLOW_SPEC_GRE"; break;
    case IBV_FLOW_SPEC_MPLS: name = "IBV_FLOW_SPEC_MPLS"; break;
    case IBV_FLOW_SPEC_ACTION_TAG: name = "IBV_FLOW_SPEC_ACTION_TAG"; break;
    case IBV_FLOW_SPEC_ACTION_DROP: name = "IBV_FLOW_SPEC_ACTION_DROP"; break;
    case IBV_FLOW_SPEC_ACTION_HANDLE: name = "IBV_FLOW_SPEC_ACTION_HANDLE"; break;
    case IBV_FLOW_SPEC_ACTION_COUNT: name = "IBV_FLOW_SPEC_ACTION_COUNT"; break;
    default: break;
  }
  if (name == nullptr) return Refuse(EINVAL, fmt::format("spec type {:#x} is no ibv_flow_spec_type", type));
  return Refuse(EOPNOTSUPP, fmt::format("{}: the device steers on ETH, IPV4, IPV4_EXT, IPV6, TCP "
                                        "and UDP specs only",
                                        name));
}

// The rule an attribute describes, checked.
Result<flow::Rule> ToRule(const Qp& qp, const ibv_flow_attr& attr, const device::Device& dev) {
  if (attr.comp_mask != 0) return Refuse(EINVAL, fmt::format("comp_mask {:#x}", attr.comp_mask));
  if (qp.type != objects::QpType::kRawPacket) {
    return Refuse(EOPNOTSUPP, fmt::format("qp#{} is a {} QP: this device steers flows to "
                                          "RAW_PACKET QPs only",
                                          qp.qp->qpn, objects::ToString(qp.type)));
  }
  if (!dev.ValidPort(attr.port)) {
    return Refuse(EINVAL, fmt::format("port {} is not a port of {}", attr.port, dev.name()));
  }
  if (attr.type > IBV_FLOW_ATTR_SNIFFER) {
    return Refuse(EINVAL, fmt::format("type {} is no ibv_flow_attr_type", static_cast<int>(attr.type)));
  }
  if (uint32_t unknown = attr.flags & ~kKnownFlags; unknown != 0) {
    return Refuse(EINVAL, fmt::format("flags {:#x} are no ibv_flow_flags", unknown));
  }
  if (attr.flags != 0) {
    return Refuse(EOPNOTSUPP, fmt::format("flags {:#x}: the device has no DONT_TRAP or EGRESS rules",
                                          attr.flags));
  }
  if (attr.num_of_specs > kMaxSpecs) {
    return Refuse(EINVAL, fmt::format("{} specs (at most {})", attr.num_of_specs, kMaxSpecs));
  }
  if (attr.type != IBV_FLOW_ATTR_NORMAL && attr.num_of_specs != 0) {
    return Refuse(EINVAL, "a default or sniffer rule takes every frame left to it: it has no specs");
  }
  flow::Rule rule;
  rule.qpn = qp.qp->qpn;
  rule.port = attr.port;
  rule.type = static_cast<flow::RuleType>(attr.type);
  rule.priority = attr.priority;
  // The specs follow the attribute in memory, each led by its type and size.
  const auto* p = reinterpret_cast<const uint8_t*>(&attr + 1);
  for (uint32_t i = 0; i < attr.num_of_specs; ++i) {
    ibv_flow_spec_eth head;  // any spec: type and size lead them all
    std::memcpy(&head.type, p, sizeof head.type);
    std::memcpy(&head.size, p + offsetof(ibv_flow_spec_eth, size), sizeof head.size);
    if (head.size < offsetof(ibv_flow_spec_eth, val)) {
      return Refuse(EINVAL, fmt::format("spec {} has size {}", i, head.size));
    }
    if (Status s = ReadSpec(p, head.type, head.size, rule.match); !s.ok()) return s;
    p += head.size;
  }
  // attr.size is not checked: libibverbs computes the command's length
  // from the specs' own sizes, and programs (pyverbs among them) leave it
  // at sizeof(struct ibv_flow_attr).
  return rule;
}

ibv_flow* CreateFlow(ibv_qp* ibv_qp, ibv_flow_attr* attr) {
  if (attr == nullptr || !HandleOf(ibv_qp, Kind::kQp, ibv_qp->context, "ibv_create_flow", "qp")) {
    errno = EINVAL;
    return nullptr;
  }
  Qp* qp = ToQp(ibv_qp);
  Context* ctx = ToContext(ibv_qp->context);
  auto rule = ToRule(*qp, *attr, *ctx->device);
  if (!rule.ok()) {
    errno = rule.status().code();
    return nullptr;
  }
  auto id = ctx->engine->AddFlow(*rule);
  if (!id.ok()) {
    Log().warn("ibv_create_flow qp#{}: {}", qp->qp->qpn, id.status().message());
    errno = id.status().code();
    return nullptr;
  }
  auto* f = new Flow{};
  f->ibv.context = ibv_qp->context;
  f->ibv.handle = static_cast<uint32_t>(*id);
  f->id = *id;
  f->qp = qp;
  ++qp->flows;
  AddHandle(&f->ibv, Kind::kFlow, ibv_qp->context);
  return &f->ibv;
}

int DestroyFlow(ibv_flow* ibv) {
  if (ibv == nullptr || !HandleOf(ibv, Kind::kFlow, ibv->context, "ibv_destroy_flow", "flow_id")) {
    return EINVAL;
  }
  auto* f = reinterpret_cast<Flow*>(ibv);
  if (Status s = ToContext(ibv->context)->engine->RemoveFlow(f->id); !s.ok()) {
    Log().error("ibv_destroy_flow: {}", s.message());
  }
  --f->qp->flows;
  RemoveHandle(ibv);
  check::Dispose(f);
  return 0;
}

}  // namespace

void InstallFlowOps(verbs_context* vctx) {
  vctx->ibv_create_flow = CreateFlow;
  vctx->ibv_destroy_flow = DestroyFlow;
  // Programs built against libibverbs 1.1.8 reach flows through these.
  vctx->ABI_placeholder1 = reinterpret_cast<void (*)()>(CreateFlow);
  vctx->ABI_placeholder2 = reinterpret_cast<void (*)()>(DestroyFlow);
}

}  // namespace rdmaemu::provider
