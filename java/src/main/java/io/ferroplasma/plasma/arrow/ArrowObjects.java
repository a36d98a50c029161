package io.ferroplasma.plasma.arrow;

import io.ferroplasma.plasma.PlasmaClient;
import io.ferroplasma.plasma.StoreBuffer;
import io.ferroplasma.plasma.exceptions.PlasmaClientException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.WritableByteChannel;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.dictionary.DictionaryProvider;
import org.apache.arrow.vector.ipc.ArrowStreamWriter;

/**
 * Arrow tables in the store, as Python stores them (docs/serialization.md: an Arrow IPC stream
 * behind ferroplasma's 64-byte header), so that a table Python puts is read here in place and a
 * table put here is a zero-copy {@code pyarrow.Table} for Python's {@code get}.
 *
 * <pre>{@code
 * try (BufferAllocator allocator = new RootAllocator();
 *      StoreArrowReader reader = ArrowObjects.getTable(client, id, 5000, allocator)) {
 *   VectorSchemaRoot root = reader.getVectorSchemaRoot();
 *   while (reader.loadNextBatch()) {
 *     // root's vectors are the store's bytes
 *   }
 * }
 * }</pre>
 */
public final class ArrowObjects {
  private ArrowObjects() {}

  /** Bytes before the IPC stream: Python's header, padded to 64. */
  static final int HEADER = 64;

  /**
   * A reader of the table or record batch stored under {@code objectId}, waiting up to {@code
   * timeoutMs} (negative: forever) for it to be sealed; its batches are views of the store.
   *
   * @throws PlasmaClientException if the object is not sealed in time (status {@code
   *     FP_OBJECT_NOT_FOUND}) or is not an Arrow table or batch
   */
  public static StoreArrowReader getTable(
      PlasmaClient client, byte[] objectId, long timeoutMs, BufferAllocator allocator) {
    StoreBuffer buffer = client.getBuffer(objectId, timeoutMs);
    if (buffer == null) {
      throw new PlasmaClientException(
          3,
          "object "
              + PlasmaClient.hex(objectId)
              + " is not available: not sealed within "
              + timeoutMs
              + " ms");
    }
    try {
      return new StoreArrowReader(buffer, allocator);
    } catch (RuntimeException e) {
      buffer.close();
      throw e;
    }
  }

  /**
   * Stores the batch in {@code root} under {@code objectId} as a table, in one copy straight into
   * the store (the stream is measured first, then written into the object), sealed.
   */
  public static void putTable(PlasmaClient client, byte[] objectId, VectorSchemaRoot root)
      throws IOException {
    putTable(client, objectId, root, null);
  }

  /** {@link #putTable(PlasmaClient, byte[], VectorSchemaRoot)} with dictionary-encoded columns. */
  public static void putTable(
      PlasmaClient client, byte[] objectId, VectorSchemaRoot root, DictionaryProvider dictionaries)
      throws IOException {
    Counter counter = new Counter();
    writeStream(root, dictionaries, counter);
    long total = HEADER + counter.bytes;
    if (total > Integer.MAX_VALUE) {
      throw new PlasmaClientException(6, "a table of " + total + " bytes is over 2 GiB");
    }
    ByteBuffer object = client.create(objectId, (int) total, null);
    boolean sealed = false;
    try {
      // The whole header: the store does not clear memory it reuses.
      ByteBuffer header = object.duplicate().order(ByteOrder.LITTLE_ENDIAN);
      header.put(new byte[HEADER]).position(0);
      header.put(new byte[] {'F', 'P', 'S', 'O', 1, 1}); // magic, version 1, kind: table
      header.putLong(16, HEADER).putLong(24, counter.bytes);
      Into into = new Into(object.duplicate().position(HEADER));
      writeStream(root, dictionaries, into);
      if (into.dst.position() != total) {
        throw new IOException("the Arrow stream changed size between two writes of one batch");
      }
      sealed = true; // from here the seal owns the draft, whatever it does
      client.seal(objectId);
      client.release(objectId);
    } catch (IOException | RuntimeException e) {
      if (!sealed) {
        try {
          client.abort(objectId);
        } catch (RuntimeException abortFailed) {
          e.addSuppressed(abortFailed);
        }
      }
      throw e;
    }
  }

  private static void writeStream(
      VectorSchemaRoot root, DictionaryProvider dictionaries, WritableByteChannel out)
      throws IOException {
    try (ArrowStreamWriter writer = new ArrowStreamWriter(root, dictionaries, out)) {
      writer.start();
      writer.writeBatch();
      writer.end();
    }
  }

  /** A channel that only counts. */
  private static final class Counter implements WritableByteChannel {
    long bytes;

    @Override
    public int write(ByteBuffer src) {
      int n = src.remaining();
      src.position(src.limit());
      bytes += n;
      return n;
    }

    @Override
    public boolean isOpen() {
      return true;
    }

    @Override
    public void close() {}
  }

  /** A channel into the object's memory. */
  private static final class Into implements WritableByteChannel {
    final ByteBuffer dst;

    Into(ByteBuffer dst) {
      this.dst = dst;
    }

    @Override
    public int write(ByteBuffer src) throws IOException {
      int n = src.remaining();
      if (n > dst.remaining()) {
        throw new IOException("the Arrow stream grew between two writes of one batch");
      }
      dst.put(src);
      return n;
    }

    @Override
    public boolean isOpen() {
      return true;
    }

    @Override
    public void close() {}
  }
}
