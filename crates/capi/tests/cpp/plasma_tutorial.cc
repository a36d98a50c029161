// A program written the way Plasma's C++ tutorial and its users wrote them:
// Plasma's headers and namespace, arrow::Status and its macros, Plasma's
// buffers handed to Arrow's readers and writers. python/tests/
// test_plasma_cpp.py builds this one source against Plasma 11 and against
// ferroplasma's Plasma headers (only the include path and link flags
// differ), runs each against its own store and compares what they print.
//
//   usage: plasma_tutorial STORE_SOCKET

#include <iostream>
#include <string>
#include <unordered_set>
#include <vector>

#include <arrow/buffer.h>
#include <arrow/io/memory.h>
#include <arrow/status.h>
#include <arrow/util/logging.h>

#include "plasma/client.h"

using namespace plasma;

// Writes `text` into a new object through an Arrow writer, then seals it.
Status PutText(PlasmaClient* client, const ObjectID& id, const std::string& text) {
  std::shared_ptr<Buffer> buffer;
  const std::string metadata = "text/plain";
  RETURN_NOT_OK(client->Create(id, static_cast<int64_t>(text.size()),
                               reinterpret_cast<const uint8_t*>(metadata.data()),
                               static_cast<int64_t>(metadata.size()), &buffer));
  arrow::io::FixedSizeBufferWriter writer(buffer);
  RETURN_NOT_OK(writer.Write(text.data(), static_cast<int64_t>(text.size())));
  RETURN_NOT_OK(writer.Close());
  RETURN_NOT_OK(client->Seal(id));
  return client->Release(id);
}

// Reads an object back through an Arrow reader.
Status GetText(PlasmaClient* client, const ObjectID& id, std::string* out) {
  std::vector<ObjectBuffer> got;
  RETURN_NOT_OK(client->Get({id}, /*timeout_ms=*/-1, &got));
  if (!got[0].data) return Status::KeyError("no object ", id.hex());
  arrow::io::BufferReader reader(got[0].data);
  std::shared_ptr<Buffer> bytes;
  ARROW_ASSIGN_OR_RAISE(bytes, reader.Read(got[0].data->size()));
  *out = bytes->ToString() + " [" + got[0].metadata->ToString() + "]";
  return Status::OK();
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: plasma_tutorial STORE_SOCKET\n";
    return 2;
  }
  PlasmaClient client, watcher;
  ARROW_CHECK_OK(client.Connect(argv[1], ""));
  ARROW_CHECK_OK(watcher.Connect(argv[1], ""));
  int fd = -1;
  ARROW_CHECK_OK(watcher.Subscribe(&fd));

  ObjectID id = ObjectID::from_binary(std::string(kUniqueIDSize, 'a'));
  ARROW_CHECK_OK(PutText(&client, id, "hello, plasma"));
  std::string text;
  ARROW_CHECK_OK(GetText(&client, id, &text));
  std::cout << "read: " << text << "\n";

  ObjectID seen;
  int64_t data_size = 0, metadata_size = 0;
  ARROW_CHECK_OK(watcher.GetNotification(fd, &seen, &data_size, &metadata_size));
  std::cout << "notified: " << (seen == id) << " " << data_size << " " << metadata_size << "\n";

  std::unordered_set<ObjectID> ids = {id};
  std::cout << "hex: " << id.hex() << " in set: " << ids.count(id) << "\n";

  Status again = PutText(&client, id, "again");
  std::cout << "again: exists=" << IsPlasmaObjectExists(again) << "\n";

  std::vector<ObjectBuffer> got;
  ARROW_CHECK_OK(client.Get({id}, 0, &got));
  auto copy = std::make_shared<Buffer>(got[0].data->data(), got[0].data->size());
  std::cout << "equals: " << got[0].data->Equals(*copy) << "\n";

  ObjectTable table;
  ARROW_CHECK_OK(client.List(&table));
  std::cout << "listed: " << table.size() << " sealed="
            << (table[id]->state == ObjectState::PLASMA_SEALED) << " size="
            << table[id]->data_size << "\n";

  got.clear();
  ARROW_CHECK_OK(client.Delete(id));
  bool has = true;
  ARROW_CHECK_OK(client.Contains(id, &has));
  ARROW_CHECK_OK(watcher.GetNotification(fd, &seen, &data_size, &metadata_size));
  std::cout << "deleted: contains=" << has << " notified=" << (seen == id) << " "
            << data_size << "\n";

  ARROW_CHECK_OK(client.CreateAndSeal(id, "small", ""));
  int64_t evicted = 0;
  ARROW_CHECK_OK(client.Evict(1 << 20, evicted));
  std::cout << "evicted: " << evicted << "\n";

  ARROW_CHECK_OK(watcher.Disconnect());
  ARROW_CHECK_OK(client.Disconnect());
  return 0;
}
