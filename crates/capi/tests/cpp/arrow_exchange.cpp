// Arrow data between Python and C++ through the store, without copying.
//
//   arrow_exchange SOCKET read TABLE_HEX ARRAY_HEX
//       gets the pyarrow Table and the numpy array Python put; prints one
//       line per column (its checksum) and one for the array; checks that
//       every Arrow buffer and the array's data lie inside the object's
//       bytes in the store (no copy). Exit 0 when they do.
//   arrow_exchange SOCKET put HEX
//       puts a table (int64, string and list<int32> columns with nulls)
//       that Python then gets.
#include "ferroplasma_arrow.hpp"

#include <cstdio>
#include <cstring>
#include <string>

using ferroplasma::ObjectID;
using ferroplasma::PlasmaClient;

static int outside = 0;

// Every buffer of `data` (and of its children) lies in [lo, hi).
static void CheckInside(const arrow::ArrayData& data, const uint8_t* lo, const uint8_t* hi) {
  for (const auto& b : data.buffers) {
    if (b && b->size() > 0 && (b->data() < lo || b->data() + b->size() > hi)) outside++;
  }
  for (const auto& child : data.child_data) CheckInside(*child, lo, hi);
}

static std::string Checksum(const arrow::ChunkedArray& column) {
  double sum = 0;
  int64_t count = 0, nulls = column.null_count();
  for (const auto& chunk : column.chunks()) {
    switch (chunk->type_id()) {
      case arrow::Type::INT64: {
        auto a = std::static_pointer_cast<arrow::Int64Array>(chunk);
        for (int64_t i = 0; i < a->length(); i++)
          if (a->IsValid(i)) sum += static_cast<double>(a->Value(i)), count++;
        break;
      }
      case arrow::Type::DOUBLE: {
        auto a = std::static_pointer_cast<arrow::DoubleArray>(chunk);
        for (int64_t i = 0; i < a->length(); i++)
          if (a->IsValid(i)) sum += a->Value(i), count++;
        break;
      }
      case arrow::Type::STRING: {
        auto a = std::static_pointer_cast<arrow::StringArray>(chunk);
        for (int64_t i = 0; i < a->length(); i++)
          if (a->IsValid(i)) sum += static_cast<double>(a->GetView(i).size()), count++;
        break;
      }
      case arrow::Type::LIST: {
        auto a = std::static_pointer_cast<arrow::ListArray>(chunk);
        auto values = std::static_pointer_cast<arrow::Int32Array>(a->values());
        for (int64_t i = 0; i < a->length(); i++) {
          if (!a->IsValid(i)) continue;
          count++;
          for (int32_t j = a->value_offset(i); j < a->value_offset(i + 1); j++)
            sum += values->Value(j);
        }
        break;
      }
      default:
        return "unsupported type " + chunk->type()->ToString();
    }
  }
  char out[128];
  std::snprintf(out, sizeof out, "count=%lld nulls=%lld sum=%.3f", static_cast<long long>(count),
                static_cast<long long>(nulls), sum);
  return out;
}

static int Read(PlasmaClient& client, const std::string& table_hex, const std::string& array_hex) {
  fp_object_id tid, aid;
  if (fp_object_id_from_hex(table_hex.c_str(), &tid) != FP_OK ||
      fp_object_id_from_hex(array_hex.c_str(), &aid) != FP_OK)
    return 2;
  std::vector<ferroplasma::ObjectBuffer> got;
  auto st = client.Get({ObjectID(tid), ObjectID(aid)}, 5000, &got);
  if (!st.ok() || !got[0].data || !got[1].data) return 3;
  const uint8_t* lo = got[0].data->data();
  const uint8_t* hi = lo + got[0].data->size();

  auto table = ferroplasma::GetTable(client, ObjectID(tid), 5000);
  if (!table.ok()) {
    std::fprintf(stderr, "%s\n", table.status().ToString().c_str());
    return 4;
  }
  if (!(*table)->ValidateFull().ok()) return 5;
  std::printf("rows %lld\n", static_cast<long long>((*table)->num_rows()));
  for (int i = 0; i < (*table)->num_columns(); i++) {
    auto column = (*table)->column(i);
    for (const auto& chunk : column->chunks()) CheckInside(*chunk->data(), lo, hi);
    std::printf("column %s %s\n", (*table)->field(i)->name().c_str(), Checksum(*column).c_str());
  }

  fp_ndarray arr;
  if (fp_ndarray_info(got[1].data->c_buffer(), &arr) != FP_OK) {
    std::fprintf(stderr, "ndarray: %s\n", fp_last_error());
    return 6;
  }
  const uint8_t* alo = got[1].data->data();
  if (arr.data < alo || arr.data + arr.size > alo + got[1].data->size()) outside++;
  double sum = 0;
  if (std::strcmp(arr.typestr, "<f8") == 0) {
    const double* v = reinterpret_cast<const double*>(arr.data);
    for (uint64_t i = 0; i < arr.size / 8; i++) sum += v[i];
  }
  std::printf("array %s ndim=%u shape=%llux%llu order=%c sum=%.3f\n", arr.typestr, arr.ndim,
              static_cast<unsigned long long>(arr.shape[0]),
              static_cast<unsigned long long>(arr.ndim > 1 ? arr.shape[1] : 1),
              arr.fortran_order ? 'F' : 'C', sum);
  std::printf("outside %d\n", outside);
  return outside == 0 ? 0 : 7;
}

static int Put(PlasmaClient& client, const std::string& hex) {
  fp_object_id id;
  if (fp_object_id_from_hex(hex.c_str(), &id) != FP_OK) return 2;
  arrow::Int64Builder ints;
  arrow::StringBuilder strings;
  arrow::ListBuilder lists(arrow::default_memory_pool(), std::make_shared<arrow::Int32Builder>());
  auto* items = static_cast<arrow::Int32Builder*>(lists.value_builder());
  for (int i = 0; i < 1000; i++) {
    if (i % 7 == 0) {
      (void)ints.AppendNull();
      (void)strings.AppendNull();
      (void)lists.AppendNull();
      continue;
    }
    (void)ints.Append(i * 3);
    (void)strings.Append("row " + std::to_string(i));
    (void)lists.Append();
    for (int j = 0; j < i % 4; j++) (void)items->Append(i + j);
  }
  std::shared_ptr<arrow::Array> a, b, c;
  if (!ints.Finish(&a).ok() || !strings.Finish(&b).ok() || !lists.Finish(&c).ok()) return 3;
  auto schema = arrow::schema({arrow::field("i", arrow::int64()), arrow::field("s", arrow::utf8()),
                               arrow::field("l", arrow::list(arrow::int32()))});
  auto table = arrow::Table::Make(schema, {a, b, c});
  auto st = ferroplasma::PutTable(client, ObjectID(id), *table);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 4;
  }
  std::printf("put\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  PlasmaClient client;
  if (!client.Connect(argv[1]).ok()) return 1;
  std::string mode = argv[2];
  if (mode == "read" && argc == 5) return Read(client, argv[3], argv[4]);
  if (mode == "put") return Put(client, argv[3]);
  return 2;
}
