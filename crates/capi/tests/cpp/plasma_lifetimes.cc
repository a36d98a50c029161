// Lifetimes that plasma/client.h must get right and that only a sanitizer
// sees go wrong (python/tests/test_plasma_cpp.py builds this with
// -fsanitize=address,undefined against ferroplasma's Plasma headers):
//
// - a Get waiting in one thread while another Disconnects: the Disconnect
//   waits for the Get (it holds the client's lock, as Plasma's did), so the
//   Get never reads a freed client;
// - buffers that outlive the thread that got them, and buffers held by a
//   static object until after main returns: each thread's cache of freed
//   buffer blocks is gone by then, and the blocks must go straight to the
//   allocator rather than into a destroyed cache;
// - one batch's buffers dropped on four threads at once: each drop releases
//   its object by index in the batch's one C handle, and the last frees the
//   handle, which no other drop may touch after.
//
//   usage: plasma_lifetimes STORE_SOCKET     prints "ok" and exits 0

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "plasma/client.h"
#include "plasma/test_util.h"

using namespace plasma;

namespace {

void Check(const arrow::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// Held until after main returns: destroyed after main's thread-local cache.
std::vector<ObjectBuffer> kept_past_main;

ObjectID Put(PlasmaClient& c, uint8_t value) {
  ObjectID id = random_object_id();
  std::shared_ptr<Buffer> buf;
  Check(c.Create(id, 8, &value, 1, &buf), "Create");
  buf->mutable_data()[0] = value;
  Check(c.Seal(id), "Seal");
  Check(c.Release(id), "Release");
  return id;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;

  // A Get waiting for an object nobody makes, and a Disconnect meanwhile.
  {
    PlasmaClient c;
    Check(c.Connect(argv[1]), "Connect");
    arrow::Status got_status;
    std::vector<ObjectBuffer> got;
    std::thread getter([&] { got_status = c.Get({random_object_id()}, 600, &got); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto t0 = std::chrono::steady_clock::now();
    Check(c.Disconnect(), "Disconnect");
    auto waited = std::chrono::steady_clock::now() - t0;
    getter.join();
    Check(got_status, "Get");
    if (got.size() != 1 || got[0].data) return 3;
    if (waited < std::chrono::milliseconds(300)) {
      std::fprintf(stderr, "Disconnect did not wait for the Get\n");
      return 4;
    }
    std::vector<ObjectBuffer> after;
    if (c.Get({random_object_id()}, 0, &after).ok()) return 5;
  }

  PlasmaClient c;
  Check(c.Connect(argv[1]), "Connect");
  std::vector<ObjectID> ids;
  for (uint8_t i = 0; i < 64; i++) ids.push_back(Put(c, i));

  // Buffers got on a thread that then exits, used and dropped on this one.
  std::vector<ObjectBuffer> from_thread;
  std::thread([&] { Check(c.Get(ids, 0, &from_thread), "Get"); }).join();
  for (size_t i = 0; i < ids.size(); i++) {
    if (from_thread[i].data->data()[0] != i || from_thread[i].metadata->data()[0] != i) return 6;
  }
  from_thread.clear();

  // One batch's buffers dropped on four threads at once.
  std::vector<ObjectID> raced;
  for (uint8_t i = 0; i < 32; i++) raced.push_back(Put(c, i));
  for (int round = 0; round < 20; round++) {
    std::vector<ObjectBuffer> batch;
    Check(c.Get(raced, 0, &batch), "Get");
    std::vector<std::thread> droppers;
    for (size_t t = 0; t < 4; t++) {
      std::vector<ObjectBuffer> part;
      for (size_t i = t; i < batch.size(); i += 4) part.push_back(std::move(batch[i]));
      droppers.emplace_back([part = std::move(part)]() mutable { part.clear(); });
    }
    batch.clear();
    for (auto& d : droppers) d.join();
  }
  // Every object of those batches was released: a delete frees each at once.
  Check(c.Delete(raced), "Delete");
  for (const auto& id : raced) {
    bool has = true;
    Check(c.Contains(id, &has), "Contains");
    if (has) return 7;
  }

  // Buffers kept by a static until after main returns (and its client).
  Check(c.Get(ids, 0, &kept_past_main), "Get");
  std::thread([&] {
    std::vector<ObjectBuffer> more;
    Check(c.Get(ids, 0, &more), "Get");
    kept_past_main.insert(kept_past_main.end(), more.begin(), more.end());
  }).join();
  std::printf("ok\n");
  return 0;
}
