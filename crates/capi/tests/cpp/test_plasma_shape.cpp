// Plasma-style C++ code, as it was written against plasma/client.h, with the
// include and the namespace changed: it runs against ferroplasma.
//
//   test_plasma_shape SOCKET    prints "ok" when every check passed
#include "ferroplasma.hpp"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using ferroplasma::ObjectBuffer;
using ferroplasma::ObjectID;
using ferroplasma::PlasmaClient;

static int failures = 0;
#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);  \
      failures++;                                                                     \
    }                                                                                 \
  } while (0)
#define CHECK_OK(expr)                                                                \
  do {                                                                                \
    auto _s = (expr);                                                                 \
    if (!_s.ok()) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,             \
                   _s.ToString().c_str());                                            \
      failures++;                                                                     \
    }                                                                                 \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  PlasmaClient client;
  CHECK_OK(client.Connect(argv[1], ""));

  int fd = -1;
  CHECK_OK(client.Subscribe(&fd));
  CHECK(fd >= 0);

  // Create, write, seal: the Plasma way.
  ObjectID object_id = ObjectID::from_random();
  std::string metadata = "{'shape': [100]}";
  std::shared_ptr<ferroplasma::Buffer> data;
  CHECK_OK(client.Create(object_id, 100, reinterpret_cast<const uint8_t*>(metadata.data()),
                         metadata.size(), &data));
  for (int64_t i = 0; i < data->size(); i++) data->mutable_data()[i] = static_cast<uint8_t>(i);
  CHECK_OK(client.Seal(object_id));
  CHECK(!data->is_mutable() && data->data()[99] == 99);  // still readable after the seal

  ObjectID got_id;
  int64_t data_size = 0, metadata_size = 0;
  CHECK_OK(client.GetNotification(fd, &got_id, &data_size, &metadata_size));
  CHECK(got_id == object_id && data_size == 100 &&
        metadata_size == static_cast<int64_t>(metadata.size()));

  bool has = false;
  CHECK_OK(client.Contains(object_id, &has));
  CHECK(has);

  std::vector<ObjectBuffer> buffers;
  CHECK_OK(client.Get({object_id, ObjectID::from_random()}, 0, &buffers));
  CHECK(buffers.size() == 2);
  CHECK(buffers[0].data && buffers[0].data->size() == 100 && buffers[0].data->data()[42] == 42);
  CHECK(buffers[0].metadata->ToString() == metadata);
  CHECK(!buffers[1].data);  // never created: not available in time
  CHECK_OK(client.Release(object_id));

  // Errors come back as statuses.
  auto exists = client.Create(object_id, 10, nullptr, 0, &data);
  CHECK(exists.IsObjectExists());
  CHECK(!client.Seal(ObjectID::from_random()).ok());

  // Abort frees the id; CreateAndSeal in one call.
  ObjectID other = ObjectID::from_binary("twenty bytes, exact.");
  std::shared_ptr<ferroplasma::Buffer> scratch;
  CHECK_OK(client.Create(other, 8, nullptr, 0, &scratch));
  CHECK_OK(client.Abort(other));
  CHECK_OK(client.Contains(other, &has));
  CHECK(!has);
  CHECK_OK(client.CreateAndSeal(other, "payload", "meta"));
  CHECK_OK(client.GetNotification(fd, &got_id, &data_size, &metadata_size));
  CHECK(got_id == other && data_size == 7 && metadata_size == 4);
  CHECK_OK(client.Get({other}, -1, &buffers));
  CHECK(buffers[0].data->ToString() == "payload");

  // Delete (deferred while buffers live), evict, notification of the delete.
  buffers.clear();
  data.reset();
  CHECK_OK(client.Delete(std::vector<ObjectID>{object_id, other}));
  for (int i = 0; i < 2; i++) {
    CHECK_OK(client.GetNotification(fd, &got_id, &data_size, &metadata_size));
    CHECK(data_size == -1 && metadata_size == -1);
  }
  int64_t evicted = -1;
  CHECK_OK(client.Evict(1000, evicted));
  CHECK(evicted == 0);
  // Null outputs are a status, not a crash.
  CHECK(client.Create(ferroplasma::ObjectID::from_random(), 8, nullptr, 0, nullptr).code() ==
        FP_INVALID_ARGUMENT);
  CHECK(client.Get({object_id}, 0, nullptr).code() == FP_INVALID_ARGUMENT);
  CHECK(client.GetNotification(fd, nullptr, nullptr, nullptr).code() == FP_INVALID_ARGUMENT);
  CHECK(client.Subscribe(nullptr).code() == FP_INVALID_ARGUMENT);
  CHECK_OK(client.Disconnect());

  if (failures) {
    std::fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
