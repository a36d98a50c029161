// ferroplasma_arrow.hpp: Arrow tables in the store, from C++, without copying.
// Header-only, on ferroplasma.hpp and Arrow C++ (pyarrow's wheel ships both
// libarrow and its headers: pyarrow.get_include(), pyarrow.get_library_dirs()).
//
//   GetTable: a table Python (or anyone) put, as an arrow::Table whose column
//             buffers are views of the store's shared memory.
//   PutTable: writes a table as Python's kind-1 object (an Arrow IPC stream
//             behind ferroplasma's 64-byte header), which Python's get reads
//             as a zero-copy pyarrow.Table.
#ifndef FERROPLASMA_ARROW_HPP
#define FERROPLASMA_ARROW_HPP

#include "ferroplasma.hpp"

#include <arrow/api.h>
#include <arrow/io/memory.h>
#include <arrow/ipc/reader.h>
#include <arrow/ipc/writer.h>

#include <cstring>
#include <memory>
#include <string>

namespace ferroplasma {

/// An arrow::Buffer over bytes of the store that keeps the object alive.
class StoreBuffer : public arrow::Buffer {
 public:
  StoreBuffer(const uint8_t* data, int64_t size, std::shared_ptr<ferroplasma::Buffer> keep)
      : arrow::Buffer(data, size), keep_(std::move(keep)) {}

 private:
  std::shared_ptr<ferroplasma::Buffer> keep_;
};

inline arrow::Status ToArrow(const Status& s) {
  return s.ok() ? arrow::Status::OK() : arrow::Status::IOError(s.ToString());
}

/// The table stored under `id` (waiting up to `timeout_ms`, -1: forever).
/// The columns' buffers lie in the store; the object stays alive as long
/// as the table (or any of its buffers) does.
inline arrow::Result<std::shared_ptr<arrow::Table>> GetTable(PlasmaClient& client,
                                                              const ObjectID& id,
                                                              int64_t timeout_ms = -1) {
  std::vector<ObjectBuffer> got;
  ARROW_RETURN_NOT_OK(ToArrow(client.Get({id}, timeout_ms, &got)));
  if (!got[0].data) return arrow::Status::KeyError("object ", id.hex(), " is not available");
  fp_layout layout;
  ARROW_RETURN_NOT_OK(ToArrow(Status::FromC(fp_object_layout(got[0].data->c_buffer(), &layout))));
  if (layout.kind != FP_KIND_ARROW_TABLE && layout.kind != FP_KIND_ARROW_BATCH)
    return arrow::Status::TypeError("object ", id.hex(), " is not an Arrow table or batch");
  auto payload = std::make_shared<StoreBuffer>(layout.payload,
                                               static_cast<int64_t>(layout.payload_size),
                                               got[0].data);
  auto input = std::make_shared<arrow::io::BufferReader>(payload);
  ARROW_ASSIGN_OR_RAISE(auto reader, arrow::ipc::RecordBatchStreamReader::Open(input));
  return reader->ToTable();
}

/// Stores `table` under `id` as Python's kind-1 object (one copy, straight
/// into the store) and seals it.
inline arrow::Status PutTable(PlasmaClient& client, const ObjectID& id,
                              const arrow::Table& table) {
  constexpr int64_t kHead = 64;  // ferroplasma's header, padded to 64 bytes
  arrow::io::MockOutputStream mock;
  {
    ARROW_ASSIGN_OR_RAISE(auto w, arrow::ipc::MakeStreamWriter(&mock, table.schema()));
    ARROW_RETURN_NOT_OK(w->WriteTable(table));
    ARROW_RETURN_NOT_OK(w->Close());
  }
  const int64_t size = mock.GetExtentBytesWritten();
  std::shared_ptr<ferroplasma::Buffer> out;
  ARROW_RETURN_NOT_OK(ToArrow(client.Create(id, kHead + size, nullptr, 0, &out)));
  uint8_t* p = out->mutable_data();
  std::memset(p, 0, kHead);
  std::memcpy(p, "FPSO", 4);
  p[4] = 1;  // format version
  p[5] = 1;  // kind: Arrow IPC stream of a table
  const uint64_t payload_at = kHead, payload_len = static_cast<uint64_t>(size);
  for (int i = 0; i < 8; i++) {  // little-endian offset and length
    p[16 + i] = static_cast<uint8_t>(payload_at >> (8 * i));
    p[24 + i] = static_cast<uint8_t>(payload_len >> (8 * i));
  }
  arrow::io::FixedSizeBufferWriter sink(
      std::make_shared<arrow::MutableBuffer>(p + kHead, size));
  arrow::Status written = [&]() -> arrow::Status {
    ARROW_ASSIGN_OR_RAISE(auto w, arrow::ipc::MakeStreamWriter(&sink, table.schema()));
    ARROW_RETURN_NOT_OK(w->WriteTable(table));
    return w->Close();
  }();
  if (!written.ok()) {
    client.Abort(id);
    return written;
  }
  return ToArrow(client.Seal(id));
}

}  // namespace ferroplasma

#endif  // FERROPLASMA_ARROW_HPP
