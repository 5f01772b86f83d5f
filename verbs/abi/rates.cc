// Conversions between enum ibv_rate, multiples of 2.5 Gb/s and Mb/s.
//
// The tables are rdma-core 44's, value for value (checked against the
// installed libibverbs.so.1), including its gaps: the FDR/EDR/HDR-era rates
// (14, 56, 112, 168, 25, 100, 200, 300 Gb/s) have no 2.5 Gb/s multiple, so
// ibv_rate_to_mult gives -1 for them and mult_to_ibv_rate never returns them.
// Unknown inputs give -1 (to_mult, to_mbps) or IBV_RATE_MAX (0).

#include <infiniband/verbs.h>

#include <cstddef>

#include "verbs/abi/exports.h"

namespace {

struct RateRow {
  enum ibv_rate rate;
  int mult;  // multiple of 2.5 Gb/s; -1 where rdma-core has none
  int mbps;
};

constexpr RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},       {IBV_RATE_5_GBPS, 2, 5000},
    {IBV_RATE_10_GBPS, 4, 10000},       {IBV_RATE_20_GBPS, 8, 20000},
    {IBV_RATE_30_GBPS, 12, 30000},      {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},      {IBV_RATE_80_GBPS, 32, 80000},
    {IBV_RATE_120_GBPS, 48, 120000},    {IBV_RATE_14_GBPS, -1, 14062},
    {IBV_RATE_56_GBPS, -1, 56250},      {IBV_RATE_112_GBPS, -1, 112500},
    {IBV_RATE_168_GBPS, -1, 168750},    {IBV_RATE_25_GBPS, -1, 25781},
    {IBV_RATE_100_GBPS, -1, 103125},    {IBV_RATE_200_GBPS, -1, 206250},
    {IBV_RATE_300_GBPS, -1, 309375},    {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},      {IBV_RATE_400_GBPS, 160, 425000},
    {IBV_RATE_600_GBPS, 240, 637500},   {IBV_RATE_800_GBPS, 320, 850000},
    {IBV_RATE_1200_GBPS, 480, 1275000},
};

const RateRow* FindRate(enum ibv_rate rate) {
  for (const RateRow& row : kRates)
    if (row.rate == rate) return &row;
  return nullptr;
}

}  // namespace

extern "C" {

int ibv_rate_to_mult(enum ibv_rate rate) {
  const RateRow* row = FindRate(rate);
  return row != nullptr ? row->mult : -1;
}

enum ibv_rate mult_to_ibv_rate(int mult) {
  if (mult <= 0) return IBV_RATE_MAX;
  for (const RateRow& row : kRates)
    if (row.mult == mult) return row.rate;
  return IBV_RATE_MAX;
}

int ibv_rate_to_mbps(enum ibv_rate rate) {
  const RateRow* row = FindRate(rate);
  return row != nullptr ? row->mbps : -1;
}

enum ibv_rate mbps_to_ibv_rate(int mbps) {
  if (mbps <= 0) return IBV_RATE_MAX;
  for (const RateRow& row : kRates)
    if (row.mbps == mbps) return row.rate;
  return IBV_RATE_MAX;
}

}  // extern "C"
