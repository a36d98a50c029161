// Per-call cost of Plasma's C++ client API (bench/calls.py builds this one
// source twice: against ferroplasma's <plasma/client.h> and against Plasma
// 11's own client, each run against its own store):
//   calls_plasma SOCKET   prints the same JSON line as calls.c
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "plasma/client.h"

using namespace plasma;

namespace {
constexpr int kBlocks = 200, kPerBlock = 100, kBatch = 1000, kBatchReps = 50;

double NowNs() {
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Check(const arrow::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// Plasma 11's ObjectID has no from_random: 20 random bytes, the same way on both.
ObjectID RandomId() {
  static std::mt19937_64 gen{std::random_device{}()};
  std::string bytes(kUniqueIDSize, '\0');
  for (auto& b : bytes) b = static_cast<char>(gen());
  return ObjectID::from_binary(bytes);
}

void Put(PlasmaClient& c, const ObjectID& id) {
  std::shared_ptr<Buffer> buf;
  Check(c.Create(id, 64, nullptr, 0, &buf), "Create");
  buf->mutable_data()[0] = 1;
  Check(c.Seal(id), "Seal");
  Check(c.Release(id), "Release");
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: calls_plasma SOCKET\n");
    return 2;
  }
  PlasmaClient c;
  Check(c.Connect(argv[1]), "Connect");
  ObjectID single = RandomId();
  Put(c, single);
  std::vector<ObjectID> batch(kBatch);
  for (auto& id : batch) {
    id = RandomId();
    Put(c, id);
  }
  std::vector<double> t(kBlocks);
  unsigned sink = 0;

  for (auto& x : t) {
    double t0 = NowNs();
    for (int i = 0; i < kPerBlock; i++) {
      std::vector<ObjectBuffer> got;
      Check(c.Get({single}, 0, &got), "Get");
      sink += got[0].data->data()[0];
    }
    x = (NowNs() - t0) / kPerBlock;
  }
  double get_ns = Median(t);

  for (auto& x : t) {
    double t0 = NowNs();
    for (int i = 0; i < kPerBlock; i++) {
      bool has = false;
      Check(c.Contains(single, &has), "Contains");
      sink += has;
    }
    x = (NowNs() - t0) / kPerBlock;
  }
  double contains_ns = Median(t);

  std::vector<ObjectID> fresh(kPerBlock);
  for (auto& x : t) {
    for (auto& id : fresh) id = RandomId();
    double t0 = NowNs();
    for (auto& id : fresh) {
      std::shared_ptr<Buffer> buf;
      Check(c.Create(id, 64, nullptr, 0, &buf), "Create");
      buf->mutable_data()[0] = 1;
      Check(c.Seal(id), "Seal");
      Check(c.Release(id), "Release");
    }
    x = (NowNs() - t0) / kPerBlock;
    Check(c.Delete(fresh), "Delete");
  }
  double create_seal_ns = Median(t);

  std::vector<double> tb(kBatchReps);
  for (auto& x : tb) {
    double t0 = NowNs();
    {
      std::vector<ObjectBuffer> got;
      Check(c.Get(batch, 0, &got), "Get");
      for (auto& b : got) sink += b.data->data()[0];
    }  // the buffers go: each object's use ends
    x = (NowNs() - t0) / 1e3;
  }
  double batch_us = Median(tb);

  Check(c.Delete(batch), "Delete");
  Check(c.Delete(single), "Delete");
  Check(c.Disconnect(), "Disconnect");
  std::printf(
      "{\"get_ns\": %.1f, \"contains_ns\": %.1f, \"create_seal_ns\": %.1f, \"batch_us\": %.2f}\n",
      get_ns, contains_ns, create_seal_ns, batch_us);
  return sink == 0xdeadbeef;
}
