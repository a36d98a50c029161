// Plasma's C++ client behaviour, as a GoogleTest suite: the scenarios of
// Plasma's own client tests (Apache Arrow 11, cpp/src/plasma/test/
// client_tests.cc), written for this project, and a few more. The same
// source builds against ferroplasma's Plasma compatibility headers
// (crates/capi/include/plasma) and against Plasma 11's own headers and
// libplasma (from the pyarrow 11.0.0 wheel); python/tests/test_plasma_cpp.py
// builds and runs both, each against its own store, so that this suite is
// shown to test what Plasma did and not only what ferroplasma does.
//
// Each test starts its own store: $PLASMA_STORE_COMMAND with {socket} and
// {memory} replaced (10,000,000 bytes, as Plasma's tests used), e.g.
//   ferroplasma store --socket {socket} --memory {memory}
//   plasma-store-server -s {socket} -m {memory}
//
// Checks only ferroplasma passes (where Plasma aborted the process or read
// out of bounds) are under FERROPLASMA_PLASMA_COMPAT, which its headers
// define. Left out, with their reasons (docs/migrating-from-plasma.md,
// "C++"):
// per-client quotas (SetClientOptions: accepted, not enforced by
// ferroplasma's store), the exact text of DebugString, and the private
// IsInUse (tests here see use through Delete and Contains instead).

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "plasma/client.h"
#include "plasma/common.h"
#include "plasma/test_util.h"

namespace plasma {
namespace {

constexpr int64_t kStoreBytes = 10000000;

#define CHECK_OK(expr)                                      \
  do {                                                      \
    ::arrow::Status st__ = (expr);                          \
    ASSERT_TRUE(st__.ok()) << #expr << ": " << st__.ToString(); \
  } while (false)

std::vector<uint8_t> Bytes(const std::shared_ptr<Buffer>& b) {
  return std::vector<uint8_t>(b->data(), b->data() + b->size());
}

/// A store process of the kind $PLASMA_STORE_COMMAND starts.
class Store {
 public:
  explicit Store(const std::string& socket) : socket_(socket) {}
  ~Store() { Stop(); }

  void Start() {
    const char* tmpl = std::getenv("PLASMA_STORE_COMMAND");
    ASSERT_NE(tmpl, nullptr) << "set PLASMA_STORE_COMMAND (see the top of this file)";
    std::string cmd = tmpl;
    Replace(&cmd, "{socket}", socket_);
    Replace(&cmd, "{memory}", std::to_string(kStoreBytes));
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      // The store's output goes to a log beside its socket.
      int log = open((socket_ + ".log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      dup2(log, 1);
      dup2(log, 2);
      execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }

  /// Waits until the socket exists (the store listens).
  void WaitReady() {
    struct stat st;
    for (int i = 0; i < 200 && stat(socket_.c_str(), &st) != 0; i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_EQ(stat(socket_.c_str(), &st), 0) << "no store at " << socket_;
  }

  void Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

 private:
  static void Replace(std::string* s, const std::string& from, const std::string& to) {
    for (size_t at = s->find(from); at != std::string::npos; at = s->find(from, at + to.size())) {
      s->replace(at, from.size(), to);
    }
  }

  std::string socket_;
  pid_t pid_ = -1;
};

class TestPlasmaStore : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/plasma-cpp-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_ = dir_ + "/store";
    store_ = std::make_unique<Store>(socket_);
    store_->Start();
    store_->WaitReady();
    CHECK_OK(client_.Connect(socket_, ""));
    CHECK_OK(client2_.Connect(socket_, ""));
  }

  void TearDown() override {
    CHECK_OK(client_.Disconnect());
    CHECK_OK(client2_.Disconnect());
    store_.reset();
    std::string rm = "rm -rf " + dir_;
    PLASMA_CHECK_SYSTEM(system(rm.c_str()));
  }

  /// Creates, fills and seals an object; releases the creator's use of it
  /// unless told not to.
  void CreateObject(PlasmaClient& client, const ObjectID& id,
                    const std::vector<uint8_t>& metadata, const std::vector<uint8_t>& data,
                    bool release = true) {
    std::shared_ptr<Buffer> buf;
    CHECK_OK(client.Create(id, static_cast<int64_t>(data.size()), metadata.data(),
                           static_cast<int64_t>(metadata.size()), &buf));
    if (!data.empty()) std::memcpy(buf->mutable_data(), data.data(), data.size());
    CHECK_OK(client.Seal(id));
    if (release) CHECK_OK(client.Release(id));
  }

  bool Has(PlasmaClient& client, const ObjectID& id) {
    bool has = false;
    EXPECT_TRUE(client.Contains(id, &has).ok());
    return has;
  }

  /// Whether some client uses `id`: a delete from a client that does not
  /// use it then leaves it in the store. Deletes it when unused.
  bool InUseThenDelete(const ObjectID& id) {
    PlasmaClient probe;
    EXPECT_TRUE(probe.Connect(socket_, "").ok());
    EXPECT_TRUE(probe.Delete(id).ok());
    bool has = Has(probe, id);
    EXPECT_TRUE(probe.Disconnect().ok());
    return has;
  }

  std::string dir_, socket_;
  std::unique_ptr<Store> store_;
  PlasmaClient client_;
  PlasmaClient client2_;
};

TEST_F(TestPlasmaStore, ANewSubscriberHearsOfExistingObjectsThenOfDeletes) {
  ObjectID id = random_object_id();
  uint8_t metadata[] = {5};
  std::shared_ptr<Buffer> data;
  CHECK_OK(client_.Create(id, 100, metadata, sizeof(metadata), &data));
  CHECK_OK(client_.Seal(id));

  int fd = -1;
  CHECK_OK(client2_.Subscribe(&fd));
  ASSERT_GT(fd, 0);
  ObjectID got = random_object_id();
  int64_t data_size = 0, metadata_size = 0;
  CHECK_OK(client2_.GetNotification(fd, &got, &data_size, &metadata_size));
  EXPECT_EQ(got, id);
  EXPECT_EQ(data_size, 100);
  EXPECT_EQ(metadata_size, 1);

  CHECK_OK(client_.Release(id));
  CHECK_OK(client_.Delete(id));
  CHECK_OK(client2_.GetNotification(fd, &got, &data_size, &metadata_size));
  EXPECT_EQ(got, id);
  EXPECT_EQ(data_size, -1);
  EXPECT_EQ(metadata_size, -1);
}

TEST_F(TestPlasmaStore, ABatchIsNotifiedObjectByObjectInOrder) {
  int fd = -1;
  CHECK_OK(client2_.Subscribe(&fd));
  ObjectID a = random_object_id(), b = random_object_id();
  CHECK_OK(client_.CreateAndSealBatch({a, b}, {"hello", "world!"}, {"1", "23"}));
  ObjectID got;
  int64_t ds = 0, ms = 0;
  CHECK_OK(client2_.GetNotification(fd, &got, &ds, &ms));
  EXPECT_EQ(got, a);
  EXPECT_EQ(ds, 5);
  EXPECT_EQ(ms, 1);
  CHECK_OK(client2_.GetNotification(fd, &got, &ds, &ms));
  EXPECT_EQ(got, b);
  EXPECT_EQ(ds, 6);
  EXPECT_EQ(ms, 2);
}

TEST_F(TestPlasmaStore, SealingAnUnknownObjectOrTwiceIsAPlasmaError) {
  ObjectID id = random_object_id();
  Status st = client_.Seal(id);
  EXPECT_TRUE(IsPlasmaObjectNotFound(st)) << st.ToString();
  EXPECT_TRUE(st.IsKeyError()) << st.ToString();

  CreateObject(client_, id, {42}, std::vector<uint8_t>(100, 0), false);
  st = client_.Seal(id);
  EXPECT_TRUE(IsPlasmaObjectAlreadySealed(st)) << st.ToString();
  EXPECT_TRUE(st.IsTypeError()) << st.ToString();
  CHECK_OK(client_.Release(id));
}

TEST_F(TestPlasmaStore, CreatingATakenIdIsPlasmaObjectExists) {
  ObjectID id = random_object_id();
  CHECK_OK(client_.CreateAndSeal(id, "x", ""));
  std::shared_ptr<Buffer> buf;
  Status st = client2_.Create(id, 10, nullptr, 0, &buf);
  EXPECT_TRUE(IsPlasmaObjectExists(st)) << st.ToString();
  st = client2_.CreateAndSeal(id, "y", "");
  EXPECT_TRUE(IsPlasmaObjectExists(st)) << st.ToString();
  EXPECT_FALSE(IsPlasmaObjectNotFound(st));
}

TEST_F(TestPlasmaStore, RefreshedObjectsAreEvictedAfterOlderOnes) {
  std::vector<ObjectID> ids;
  for (int i = 0; i < 10; i++) ids.push_back(random_object_id());
  std::vector<uint8_t> small(900 * 1000, 0);  // ten fill 90% of the store
  for (const auto& id : ids) {
    CreateObject(client_, id, {}, small);
    EXPECT_TRUE(Has(client_, ids[0]));
  }
  // The two oldest become the most recently used: the next evictions
  // (Plasma evicts a fifth of the store at a time, ferroplasma what it
  // needs) take the objects after them.
  CHECK_OK(client_.Refresh({ids[0], ids[1]}));
  CHECK_OK(client_.Refresh({random_object_id()}));  // an absent id is no error
  for (int i = 0; i < 3; i++) CreateObject(client_, random_object_id(), {}, small);
  EXPECT_TRUE(Has(client_, ids[0]));
  EXPECT_TRUE(Has(client_, ids[1]));
  EXPECT_FALSE(Has(client_, ids[2])) << "the least recently used goes first";
  EXPECT_TRUE(Has(client_, ids[9]));
}

TEST_F(TestPlasmaStore, ADeleteWaitsForTheLastUse) {
  ObjectID id = random_object_id();
  CHECK_OK(client_.Delete(id));  // absent: no error

  uint8_t metadata[] = {5};
  std::shared_ptr<Buffer> data;
  CHECK_OK(client_.Create(id, 100, metadata, sizeof(metadata), &data));
  CHECK_OK(client_.Seal(id));
  CHECK_OK(client_.Delete(id));
  EXPECT_TRUE(Has(client_, id)) << "the creator still uses it";
  EXPECT_TRUE(Has(client2_, id)) << "deleted only when no client uses it";
  CHECK_OK(client_.Release(id));
  EXPECT_FALSE(Has(client_, id));
  EXPECT_FALSE(Has(client2_, id));
  CHECK_OK(client_.Delete(id));
}

TEST_F(TestPlasmaStore, DeletingObjectsAnotherClientReadsWaitsForItsBuffers) {
  ObjectID a = random_object_id(), b = random_object_id();
  CHECK_OK(client_.Delete(std::vector<ObjectID>{a, b}));
  uint8_t metadata[] = {5};
  std::shared_ptr<Buffer> data;
  for (const auto& id : {a, b}) {
    CHECK_OK(client_.Create(id, 100, metadata, sizeof(metadata), &data));
    CHECK_OK(client_.Seal(id));
    CHECK_OK(client_.Release(id));
  }
  std::vector<ObjectBuffer> bufs;
  CHECK_OK(client2_.Get({a, b}, 0, &bufs));
  CHECK_OK(client_.Delete(std::vector<ObjectID>{a, b}));
  EXPECT_TRUE(Has(client_, a));
  EXPECT_TRUE(Has(client_, b));
  bufs.clear();  // the last use ends with the buffers
  CHECK_OK(client2_.Delete(std::vector<ObjectID>{a, b}));
  EXPECT_FALSE(Has(client_, a));
  EXPECT_FALSE(Has(client_, b));
}

TEST_F(TestPlasmaStore, ContainsSeesSealedObjectsAndWhatTheClientCreates) {
  ObjectID id = random_object_id();
  EXPECT_FALSE(Has(client_, id));
  std::shared_ptr<Buffer> buf;
  CHECK_OK(client_.Create(id, 10, nullptr, 0, &buf));
  EXPECT_TRUE(Has(client_, id)) << "the creator's own object, unsealed";
  EXPECT_FALSE(Has(client2_, id)) << "not sealed: not there for others";
  CHECK_OK(client_.Seal(id));
  CHECK_OK(client_.Release(id));
  std::vector<ObjectBuffer> bufs;
  CHECK_OK(client_.Get({id}, -1, &bufs));
  EXPECT_TRUE(Has(client_, id));
  EXPECT_TRUE(Has(client2_, id));
}

TEST_F(TestPlasmaStore, GetReturnsDataAndMetadataThatKeepTheObjectInUse) {
  ObjectID id = random_object_id();
  std::vector<ObjectBuffer> bufs;
  CHECK_OK(client_.Get({id}, 0, &bufs));
  ASSERT_EQ(bufs.size(), 1u);
  EXPECT_FALSE(bufs[0].data);
  EXPECT_FALSE(bufs[0].metadata);

  CreateObject(client_, id, {42}, {3, 5, 6, 7, 9});
  CHECK_OK(client_.Get({id}, -1, &bufs));
  ASSERT_EQ(bufs.size(), 1u);
  EXPECT_EQ(bufs[0].device_num, 0);
  EXPECT_EQ(Bytes(bufs[0].data), (std::vector<uint8_t>{3, 5, 6, 7, 9}));
  EXPECT_EQ(Bytes(bufs[0].metadata), (std::vector<uint8_t>{42}));
  EXPECT_FALSE(bufs[0].data->is_mutable());

  auto metadata = bufs[0].metadata;
  bufs.clear();
  EXPECT_EQ(Bytes(metadata), (std::vector<uint8_t>{42}));
  EXPECT_TRUE(InUseThenDelete(id)) << "the metadata buffer keeps the object in use";
  metadata.reset();
  // Asked on the connection that released it: the release comes first.
  EXPECT_FALSE(Has(client_, id)) << "released with its last buffer, then deleted";
}

TEST_F(TestPlasmaStore, GetBuffersAreCpuArrowBuffersAndNoMetadataIsAnEmptyBuffer) {
  ObjectID id = random_object_id();
  CreateObject(client_, id, {}, {7, 8, 9});
  std::vector<ObjectBuffer> bufs;
  CHECK_OK(client_.Get({id}, -1, &bufs));
  ASSERT_TRUE(bufs[0].data);
  ASSERT_TRUE(bufs[0].metadata) << "an object without metadata has an empty metadata buffer";
  EXPECT_EQ(bufs[0].metadata->size(), 0);
  const auto& data = bufs[0].data;
  EXPECT_TRUE(data->is_cpu());
  ASSERT_TRUE(data->memory_manager());
  EXPECT_TRUE(data->memory_manager()->is_cpu());
  auto slice = arrow::SliceBuffer(data, 1, 2);
  EXPECT_EQ(Bytes(slice), (std::vector<uint8_t>{8, 9}));
  const uint8_t expected[] = {8, 9};
  EXPECT_TRUE(slice->Equals(arrow::Buffer(expected, 2)));
  bufs.clear();
  EXPECT_TRUE(InUseThenDelete(id)) << "a slice keeps the object in use";
  slice.reset();
  EXPECT_FALSE(Has(client_, id));
}

TEST_F(TestPlasmaStore, TheOlderGetNeedsAReleasePerCall) {
  ObjectID id = random_object_id();
  {
    ObjectBuffer buf;
    CHECK_OK(client_.Get(&id, 1, 0, &buf));
    EXPECT_FALSE(buf.data);
    EXPECT_FALSE(buf.metadata);
    CreateObject(client_, id, {42}, {3, 5, 6, 7, 9});
    CHECK_OK(client_.Get(&id, 1, -1, &buf));
    EXPECT_EQ(Bytes(buf.data), (std::vector<uint8_t>{3, 5, 6, 7, 9}));
    EXPECT_EQ(Bytes(buf.metadata), (std::vector<uint8_t>{42}));
  }
  CHECK_OK(client2_.Delete(id));
  EXPECT_TRUE(Has(client2_, id)) << "still in use once its buffers are gone";
  CHECK_OK(client_.Release(id));
  EXPECT_FALSE(Has(client_, id));
}

TEST_F(TestPlasmaStore, GetWaitsForASealUpToItsTimeout) {
  ObjectID id = random_object_id();
  std::vector<ObjectBuffer> bufs;
  auto t0 = std::chrono::steady_clock::now();
  CHECK_OK(client_.Get({id}, 200, &bufs));
  EXPECT_FALSE(bufs[0].data);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(150));

  std::thread sealer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CreateObject(client2_, id, {}, {1, 2, 3});
  });
  CHECK_OK(client_.Get({id}, 10000, &bufs));
  sealer.join();
  ASSERT_TRUE(bufs[0].data);
  EXPECT_EQ(Bytes(bufs[0].data), (std::vector<uint8_t>{1, 2, 3}));
}

TEST_F(TestPlasmaStore, ABatchedGetReturnsEachObjectInPlace) {
  ObjectID a = random_object_id(), b = random_object_id(), missing = random_object_id();
  uint8_t metadata[] = {5};
  std::shared_ptr<Buffer> data;
  CHECK_OK(client_.Create(a, 4, metadata, sizeof(metadata), &data));
  data->mutable_data()[0] = 1;
  CHECK_OK(client_.Seal(a));
  CHECK_OK(client_.Create(b, 4, metadata, sizeof(metadata), &data));
  data->mutable_data()[0] = 2;
  CHECK_OK(client_.Seal(b));
  std::vector<ObjectBuffer> bufs;
  CHECK_OK(client_.Get({a, missing, b, a}, 100, &bufs));
  ASSERT_EQ(bufs.size(), 4u);
  EXPECT_EQ(bufs[0].data->data()[0], 1);
  EXPECT_FALSE(bufs[1].data);
  EXPECT_EQ(bufs[2].data->data()[0], 2);
  EXPECT_EQ(bufs[3].data->data(), bufs[0].data->data()) << "one object, one place";
}

TEST_F(TestPlasmaStore, CreateAndSealBatchStoresEachObject) {
  ObjectID a = random_object_id(), b = random_object_id();
  CHECK_OK(client_.CreateAndSealBatch({a, b}, {"hello", "world"}, {"1", "2"}));
  std::vector<ObjectBuffer> bufs;
  CHECK_OK(client_.Get({a, b}, -1, &bufs));
  EXPECT_EQ(bufs[0].data->ToString(), "hello");
  EXPECT_EQ(bufs[1].data->ToString(), "world");
  EXPECT_EQ(bufs[1].metadata->ToString(), "2");
#ifdef FERROPLASMA_PLASMA_COMPAT
  // Plasma read past the shorter vectors; ferroplasma says so.
  Status st = client_.CreateAndSealBatch({random_object_id()}, {"a", "b"}, {"c"});
  EXPECT_TRUE(st.IsInvalid()) << st.ToString();
#endif
}

TEST_F(TestPlasmaStore, AbortNeedsTheCreatorsUseReleasedFirst) {
  ObjectID id = random_object_id();
  std::vector<ObjectBuffer> bufs;
  CHECK_OK(client_.Get({id}, 0, &bufs));
  EXPECT_FALSE(bufs[0].data);

  uint8_t metadata[] = {5};
  std::shared_ptr<Buffer> data;
  CHECK_OK(client_.Create(id, 4, metadata, sizeof(metadata), &data));
  data->mutable_data()[0] = 9;
  Status st = client_.Abort(id);
  EXPECT_TRUE(st.IsInvalid()) << st.ToString();
  CHECK_OK(client_.Release(id));
  CHECK_OK(client_.Abort(id));
  CHECK_OK(client_.Get({id}, 0, &bufs));
  EXPECT_FALSE(bufs[0].data) << "aborted: gone";
  EXPECT_FALSE(Has(client2_, id));

  CreateObject(client_, id, {42, 43}, {1, 2, 3, 4, 5});
  CHECK_OK(client_.Get({id}, -1, &bufs));
  EXPECT_EQ(Bytes(bufs[0].data), (std::vector<uint8_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(Bytes(bufs[0].metadata), (std::vector<uint8_t>{42, 43}));
#ifdef FERROPLASMA_PLASMA_COMPAT
  // Plasma aborted the process on these; ferroplasma returns a status.
  st = client_.Abort(id);
  EXPECT_TRUE(st.IsInvalid()) << "a sealed object cannot be aborted: " << st.ToString();
  st = client_.Abort(random_object_id());
  EXPECT_TRUE(IsPlasmaObjectNotFound(st)) << st.ToString();
  st = client_.Release(random_object_id());
  EXPECT_TRUE(IsPlasmaObjectNotFound(st)) << st.ToString();
#endif
}

TEST_F(TestPlasmaStore, OneIdCanBeCreatedAgainAfterAnAbortOrADelete) {
  ObjectID id = random_object_id();
  uint8_t metadata[] = {5};
  for (int i = 0; i < 5; i++) {
    std::shared_ptr<Buffer> data;
    CHECK_OK(client_.Create(id, 20, metadata, sizeof(metadata), &data));
    CHECK_OK(client_.Release(id));
    CHECK_OK(client_.Abort(id));
  }
  for (int i = 0; i < 5; i++) {
    std::shared_ptr<Buffer> data;
    CHECK_OK(client_.Create(id, 20, metadata, sizeof(metadata), &data));
    CHECK_OK(client_.Seal(id));
    CHECK_OK(client_.Release(id));
    CHECK_OK(client_.Delete(id));
  }
}

TEST_F(TestPlasmaStore, ClientsShareObjectsAndOneLeavingDisturbsNoOther) {
  ObjectID id = random_object_id();
  EXPECT_FALSE(Has(client_, id));
  uint8_t metadata[] = {5};
  std::shared_ptr<Buffer> data;
  CHECK_OK(client2_.Create(id, 100, metadata, sizeof(metadata), &data));
  CHECK_OK(client2_.Seal(id));
  std::vector<ObjectBuffer> bufs;
  CHECK_OK(client_.Get({id}, -1, &bufs));
  EXPECT_TRUE(bufs[0].data);
  EXPECT_TRUE(Has(client_, id));

  id = random_object_id();
  CHECK_OK(client2_.Create(id, 100, metadata, sizeof(metadata), &data));
  CHECK_OK(client_.Disconnect());
  CHECK_OK(client2_.Seal(id));
  CHECK_OK(client2_.Get({id}, -1, &bufs));
  EXPECT_TRUE(bufs[0].data);
  EXPECT_TRUE(Has(client2_, id));
}

TEST_F(TestPlasmaStore, ADisconnectAbortsWhatTheClientLeftUnsealed) {
  std::vector<ObjectID> ids;
  uint8_t metadata[] = {5};
  for (int i = 0; i < 100; i++) {
    ObjectID id = random_object_id();
    ids.push_back(id);
    EXPECT_FALSE(Has(client_, id));
    std::shared_ptr<Buffer> data;
    CHECK_OK(client_.Create(id, 100, metadata, sizeof(metadata), &data));
    if (i % 3 == 0) {
      CHECK_OK(client_.Seal(id));
      EXPECT_TRUE(Has(client_, id));
    } else if (i % 3 == 1) {
      CHECK_OK(client_.Release(id));
      CHECK_OK(client_.Abort(id));
    }
  }
  CHECK_OK(client_.Disconnect());
  // The store learns of the disconnect on its own time.
  for (int tries = 0; tries < 100 && Has(client2_, ids[2]); tries++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (size_t i = 0; i < ids.size(); i++) {
    EXPECT_EQ(Has(client2_, ids[i]), i % 3 == 0) << "object " << i;
  }
  // What it left unsealed was aborted: another client may create those ids
  // (once the store has seen the disconnect).
  for (size_t i = 2; i < ids.size(); i += 3) {
    std::shared_ptr<Buffer> data;
    Status st = client2_.Create(ids[i], 10, nullptr, 0, &data);
    for (int tries = 0; tries < 100 && IsPlasmaObjectExists(st); tries++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      st = client2_.Create(ids[i], 10, nullptr, 0, &data);
    }
    CHECK_OK(st);
    CHECK_OK(client2_.Release(ids[i]));
    CHECK_OK(client2_.Abort(ids[i]));
  }
}

TEST_F(TestPlasmaStore, ADisconnectEndsAWaitForNotificationsInAnotherThread) {
#ifdef FERROPLASMA_PLASMA_COMPAT
  // Plasma's GetNotification read the fd and stayed blocked; ferroplasma's
  // returns once its client disconnects.
  PlasmaClient local;
  CHECK_OK(local.Connect(socket_, ""));
  int fd = -1;
  CHECK_OK(local.Subscribe(&fd));
  Status waited;
  std::thread waiter([&] {
    ObjectID id;
    int64_t ds = 0, ms = 0;
    waited = local.GetNotification(fd, &id, &ds, &ms);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK_OK(local.Disconnect());
  waiter.join();
  EXPECT_TRUE(waited.IsIOError()) << waited.ToString();
#endif
}

TEST_F(TestPlasmaStore, ALargeObjectRoundTrips) {
  ObjectID id = random_object_id();
  const int64_t size = 6 * 1000 * 1000;
  std::shared_ptr<Buffer> data;
  CHECK_OK(client_.Create(id, size, nullptr, 0, &data));
  for (int64_t i = 0; i < size; i += 4096) data->mutable_data()[i] = static_cast<uint8_t>(i / 4096);
  CHECK_OK(client_.Seal(id));
  CHECK_OK(client_.Release(id));
  std::vector<ObjectBuffer> bufs;
  CHECK_OK(client2_.Get({id}, -1, &bufs));
  ASSERT_EQ(bufs[0].data->size(), size);
  for (int64_t i = 0; i < size; i += 4096) {
    ASSERT_EQ(bufs[0].data->data()[i], static_cast<uint8_t>(i / 4096)) << i;
  }
  EXPECT_EQ(bufs[0].metadata->size(), 0);
}

TEST_F(TestPlasmaStore, AnObjectLargerThanTheStoreIsStoreFull) {
  std::shared_ptr<Buffer> data;
  Status st = client_.Create(random_object_id(), 2 * kStoreBytes, nullptr, 0, &data);
  EXPECT_TRUE(IsPlasmaStoreFull(st)) << st.ToString();
  EXPECT_TRUE(st.IsCapacityError()) << st.ToString();
  st = client_.Create(random_object_id(), int64_t(1) << 40, nullptr, 0, &data);
  EXPECT_TRUE(IsPlasmaStoreFull(st)) << st.ToString();
  EXPECT_TRUE(client_.store_capacity() > 0 && client_.store_capacity() <= kStoreBytes)
      << client_.store_capacity();
}

TEST_F(TestPlasmaStore, ObjectsInUseAreNeverEvictedToMakeRoom) {
  ObjectID kept = random_object_id();
  std::vector<uint8_t> big(4 * 1000 * 1000, 7);
  CreateObject(client_, kept, {}, big, false);  // still in use
  for (int i = 0; i < 4; i++) CreateObject(client2_, random_object_id(), {}, big);
  EXPECT_TRUE(Has(client2_, kept));
  std::vector<ObjectBuffer> bufs;
  CHECK_OK(client2_.Get({kept}, 0, &bufs));
  ASSERT_TRUE(bufs[0].data);
  EXPECT_EQ(bufs[0].data->data()[12345], 7);
}

TEST_F(TestPlasmaStore, EvictFreesUnusedObjects) {
  ObjectID id = random_object_id();
  CreateObject(client_, id, {}, std::vector<uint8_t>(1000 * 1000, 1));
  int64_t evicted = 0;
  CHECK_OK(client_.Evict(1000, evicted));
  EXPECT_GE(evicted, 1000 * 1000);
  EXPECT_FALSE(Has(client_, id));
  CHECK_OK(client_.Evict(1000, evicted));
  EXPECT_EQ(evicted, 0) << "nothing left to evict";
}

TEST_F(TestPlasmaStore, ListShowsEachObjectsSizesStateAndUse) {
  ObjectID sealed = random_object_id(), created = random_object_id();
  CreateObject(client_, sealed, {1, 2}, std::vector<uint8_t>(300, 0), false);
  std::shared_ptr<Buffer> data;
  CHECK_OK(client_.Create(created, 50, nullptr, 0, &data));
  ObjectTable table;
  CHECK_OK(client2_.List(&table));
  ASSERT_EQ(table.count(sealed), 1u);
  ASSERT_EQ(table.count(created), 1u);
  EXPECT_EQ(table[sealed]->data_size, 300);
  EXPECT_EQ(table[sealed]->metadata_size, 2);
  EXPECT_EQ(table[sealed]->state, ObjectState::PLASMA_SEALED);
  EXPECT_GE(table[sealed]->construct_duration, 0);
  EXPECT_EQ(table[created]->state, ObjectState::PLASMA_CREATED);
  EXPECT_EQ(table[created]->construct_duration, -1);
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  EXPECT_LE(std::abs(table[sealed]->create_time - now), 60);
}

TEST_F(TestPlasmaStore, EqualObjectsHashEqualAndAMissingOneIsNotFound) {
  ObjectID a = random_object_id(), b = random_object_id(), c = random_object_id();
  CHECK_OK(client_.CreateAndSeal(a, "hello", "m"));
  CHECK_OK(client_.CreateAndSeal(b, "hello", "m"));
  CHECK_OK(client_.CreateAndSeal(c, "hellO", "m"));
  uint8_t da[kDigestSize], db[kDigestSize], dc[kDigestSize];
  CHECK_OK(client_.Hash(a, da));
  CHECK_OK(client2_.Hash(b, db));
  CHECK_OK(client_.Hash(c, dc));
  EXPECT_EQ(std::memcmp(da, db, kDigestSize), 0);
  EXPECT_NE(std::memcmp(da, dc, kDigestSize), 0);
  Status st = client_.Hash(random_object_id(), da);
  EXPECT_TRUE(IsPlasmaObjectNotFound(st)) << st.ToString();
}

TEST_F(TestPlasmaStore, TheCreatorsBufferStaysWritableAfterSeal) {
  ObjectID id = random_object_id();
  std::shared_ptr<Buffer> data;
  CHECK_OK(client_.Create(id, 8, nullptr, 0, &data));
  EXPECT_TRUE(data->is_mutable());
  EXPECT_EQ(data->size(), 8);
  CHECK_OK(client_.Seal(id));
  EXPECT_TRUE(data->is_mutable());
  data->mutable_data()[0] = 77;
  std::vector<ObjectBuffer> bufs;
  CHECK_OK(client2_.Get({id}, 0, &bufs));
  EXPECT_EQ(bufs[0].data->data()[0], 77);
  CHECK_OK(client_.Release(id));
}

TEST_F(TestPlasmaStore, ConnectWaitsForAStoreThatStartsLate) {
  std::string late = dir_ + "/late";
  Store store(late);
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    store.Start();
  });
  PlasmaClient client;
  Status st = client.Connect(late, "");  // retries for up to 8 s
  starter.join();
  CHECK_OK(st);
  CHECK_OK(client.CreateAndSeal(random_object_id(), "late", ""));
  CHECK_OK(client.Disconnect());

  PlasmaClient nobody;
  auto t0 = std::chrono::steady_clock::now();
  st = nobody.Connect(dir_ + "/nobody", "", 0, 2);
  EXPECT_TRUE(st.IsIOError()) << st.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

TEST_F(TestPlasmaStore, IdsConvertAndHash) {
  ObjectID id = random_object_id();
  EXPECT_EQ(ObjectID::from_binary(id.binary()), id);
  EXPECT_EQ(id.binary().size(), static_cast<size_t>(kUniqueIDSize));
  EXPECT_EQ(id.hex().size(), 40u);
  EXPECT_EQ(ObjectID::size(), kUniqueIDSize);
  EXPECT_EQ(std::hash<ObjectID>()(id), id.hash());
  ObjectID other = id;
  other.mutable_data()[0] ^= 1;
  EXPECT_FALSE(other == id);
}

}  // namespace
}  // namespace plasma
