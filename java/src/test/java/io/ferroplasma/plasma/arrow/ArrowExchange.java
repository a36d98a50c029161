package io.ferroplasma.plasma.arrow;

import io.ferroplasma.plasma.NDArray;
import io.ferroplasma.plasma.PlasmaClient;
import io.ferroplasma.plasma.StoreBuffer;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.Float8Vector;
import org.apache.arrow.vector.IntVector;
import org.apache.arrow.vector.ValueVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.complex.ListVector;
import org.apache.arrow.vector.complex.impl.UnionListWriter;

/**
 * Moves Arrow tables between Python and Java through the store (python/tests/test_languages.py
 * runs it, as it runs the C, C++ and Go programs):
 *
 * <pre>
 * ArrowExchange SOCKET read TABLE_HEX ARRAY_HEX   prints "rows N", a checksum line per column,
 *     a line for the numpy array, and "outside K": how many column buffers (and the array's
 *     data) lie outside the objects' bytes in the store
 * ArrowExchange SOCKET put HEX                    puts the table Python then checks
 * </pre>
 */
public final class ArrowExchange {
  private ArrowExchange() {}

  public static void main(String[] args) throws Exception {
    try (PlasmaClient client = new PlasmaClient(args[0]);
        BufferAllocator allocator = new RootAllocator()) {
      byte[] id = PlasmaClient.idFromHex(args[2]);
      if (args[1].equals("read")) {
        int outside = read(client, id, allocator);
        outside += readArray(client, PlasmaClient.idFromHex(args[3]));
        System.out.println("outside " + outside);
      } else {
        try (VectorSchemaRoot root = table(allocator, 1000)) {
          ArrowObjects.putTable(client, id, root);
        }
        System.out.println("put");
      }
    }
  }

  /** Reads the table in place and prints its checksums; returns how many buffers were copies. */
  static int read(PlasmaClient client, byte[] id, BufferAllocator allocator) throws Exception {
    int outside = 0;
    try (StoreBuffer object = client.getBuffer(id, 5000);
        StoreArrowReader reader = ArrowObjects.getTable(client, id, 5000, allocator)) {
      long lo = object.address();
      long hi = lo + object.size();
      VectorSchemaRoot root = reader.getVectorSchemaRoot();
      List<double[]> sums = new ArrayList<>(); // count, nulls, sum per column
      for (int c = 0; c < root.getFieldVectors().size(); c++) {
        sums.add(new double[3]);
      }
      long rows = 0;
      while (reader.loadNextBatch()) {
        rows += root.getRowCount();
        for (int c = 0; c < root.getFieldVectors().size(); c++) {
          FieldVector v = root.getVector(c);
          accumulate(v, sums.get(c));
          outside += outside(v, lo, hi);
        }
      }
      System.out.println("rows " + rows);
      for (int c = 0; c < sums.size(); c++) {
        double[] s = sums.get(c);
        System.out.println(
            String.format(
                Locale.ROOT,
                "column %s count=%d nulls=%d sum=%.3f",
                root.getSchema().getFields().get(c).getName(),
                (long) s[0],
                (long) s[1],
                s[2]));
      }
    }
    return outside;
  }

  static void accumulate(ValueVector v, double[] s) {
    for (int i = 0; i < v.getValueCount(); i++) {
      if (v.isNull(i)) {
        s[1]++;
        continue;
      }
      s[0]++;
      if (v instanceof BigIntVector) {
        s[2] += ((BigIntVector) v).get(i);
      } else if (v instanceof Float8Vector) {
        s[2] += ((Float8Vector) v).get(i);
      } else if (v instanceof VarCharVector) {
        s[2] += ((VarCharVector) v).get(i).length;
      } else if (v instanceof ListVector) {
        ListVector list = (ListVector) v;
        IntVector values = (IntVector) list.getDataVector();
        for (int j = list.getElementStartIndex(i); j < list.getElementEndIndex(i); j++) {
          s[2] += values.get(j);
        }
      } else {
        throw new IllegalArgumentException("unexpected column type " + v.getField());
      }
    }
  }

  /**
   * How many of the vector's buffers (and its children's) lie outside [lo, hi). A column without
   * nulls is left out of the count for its validity bitmap only: Arrow Java always allocates that
   * one itself, all ones, whatever the stream holds (pyarrow writes none).
   */
  static int outside(FieldVector v, long lo, long hi) {
    int n = 0;
    List<ArrowBuf> own = v.getFieldBuffers();
    for (int i = 0; i < own.size(); i++) {
      ArrowBuf b = own.get(i);
      if (b.capacity() == 0 || (i == 0 && v.getNullCount() == 0)) {
        continue;
      }
      if (b.memoryAddress() < lo || b.memoryAddress() + b.capacity() > hi) {
        n++;
      }
    }
    for (FieldVector child : v.getChildrenFromFields()) {
      n += outside(child, lo, hi);
    }
    return n;
  }

  static int readArray(PlasmaClient client, byte[] id) {
    try (StoreBuffer object = client.getBuffer(id, 5000)) {
      NDArray a = object.ndarray();
      ByteBuffer data = a.data();
      double sum = 0;
      if (a.typestr().equals("<f8")) {
        for (int i = 0; i + 8 <= data.limit(); i += 8) {
          sum += data.getDouble(i);
        }
      }
      long[] shape = a.shape();
      System.out.println(
          String.format(
              Locale.ROOT,
              "array %s ndim=%d shape=%dx%d order=%c sum=%.3f",
              a.typestr(),
              shape.length,
              shape[0],
              shape.length > 1 ? shape[1] : 1,
              a.isFortranOrder() ? 'F' : 'C',
              sum));
      boolean inside =
          a.address() >= object.address()
              && a.address() + a.size() <= object.address() + object.size();
      return inside ? 0 : 1;
    }
  }

  /**
   * The table every other language puts for Python (python/tests/test_languages.py's {@code
   * table_from_other_languages}): i int64, s string, l list of int32, every 7th row null.
   */
  static VectorSchemaRoot table(BufferAllocator allocator, int rows) {
    BigIntVector i64 = new BigIntVector("i", allocator);
    VarCharVector str = new VarCharVector("s", allocator);
    ListVector list = ListVector.empty("l", allocator);
    i64.allocateNew(rows);
    str.allocateNew(rows);
    UnionListWriter w = list.getWriter();
    for (int i = 0; i < rows; i++) {
      w.setPosition(i);
      if (i % 7 == 0) {
        i64.setNull(i);
        str.setNull(i);
        continue; // the list stays null
      }
      i64.set(i, i * 3L);
      str.setSafe(i, ("row " + i).getBytes(StandardCharsets.UTF_8));
      w.startList();
      for (int j = 0; j < i % 4; j++) {
        w.integer().writeInt(i + j);
      }
      w.endList();
    }
    w.setValueCount(rows);
    i64.setValueCount(rows);
    str.setValueCount(rows);
    List<FieldVector> vectors = List.of(i64, str, list);
    VectorSchemaRoot root = new VectorSchemaRoot(vectors);
    root.setRowCount(rows);
    return root;
  }
}
