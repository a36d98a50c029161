package io.ferroplasma.plasma.arrow;

import io.ferroplasma.plasma.ObjectLayout;
import io.ferroplasma.plasma.StoreBuffer;
import io.ferroplasma.plasma.exceptions.PlasmaClientException;
import java.io.IOException;
import java.nio.ByteBuffer;
import org.apache.arrow.flatbuf.MessageHeader;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.ForeignAllocation;
import org.apache.arrow.vector.ipc.ArrowReader;
import org.apache.arrow.vector.ipc.message.MessageMetadataResult;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.arrow.vector.types.pojo.Schema;

/**
 * An {@link ArrowReader} over an Arrow IPC stream in the store (a table or record batch Python,
 * C++, Go or Java put), that reads in place: each batch's vectors have the store's bytes as their
 * buffers, sliced out of one {@link ArrowBuf} over the object, so nothing is copied. The object
 * stays held while the reader or any vector taken from it lives; the last of them to close gives
 * it back.
 *
 * <p>Use it as any ArrowReader: {@code getVectorSchemaRoot()}, then {@code loadNextBatch()} until
 * it returns false. Made by {@link ArrowObjects#getTable}.
 */
public final class StoreArrowReader extends ArrowReader {
  private final ArrowBuf payload;
  private final long size;
  private long pos;
  private boolean closed;

  StoreArrowReader(StoreBuffer buffer, BufferAllocator allocator) {
    super(allocator);
    ObjectLayout layout = buffer.layout();
    if (layout.kind() != ObjectLayout.ARROW_TABLE && layout.kind() != ObjectLayout.ARROW_BATCH) {
      throw new PlasmaClientException(
          "object "
              + io.ferroplasma.plasma.PlasmaClient.hex(buffer.id())
              + " is not an Arrow table or record batch (its kind is "
              + layout.kind()
              + ", see ObjectLayout)");
    }
    this.size = layout.payloadSize();
    // The allocation's release (when the last vector and this reader let go) closes the buffer.
    this.payload =
        allocator.wrapForeignAllocation(
            new ForeignAllocation(size, layout.payloadAddress()) {
              @Override
              protected void release0() {
                buffer.close();
              }
            });
  }

  @Override
  protected Schema readSchema() throws IOException {
    MessageMetadataResult m = nextMessage();
    if (m == null || m.headerType() != MessageHeader.Schema) {
      throw new IOException("the Arrow stream in the store does not start with a schema");
    }
    return MessageSerializer.deserializeSchema(m);
  }

  @Override
  public boolean loadNextBatch() throws IOException {
    prepareLoadNextBatch();
    while (true) {
      long start = pos;
      MessageMetadataResult m = nextMessage();
      if (m == null) {
        getVectorSchemaRoot().setRowCount(0);
        return false;
      }
      ArrowBuf body = payload.slice(pos - m.getMessageBodyLength(), m.getMessageBodyLength());
      // Deserializing takes one reference of the body (which shares the payload's count): the
      // batch holds its own on each buffer, and the reader keeps the payload's.
      body.getReferenceManager().retain();
      switch (m.headerType()) {
        case MessageHeader.RecordBatch:
          loadRecordBatch(deserialize(() -> MessageSerializer.deserializeRecordBatch(m, body), body));
          return true;
        case MessageHeader.DictionaryBatch:
          loadDictionary(deserialize(() -> MessageSerializer.deserializeDictionaryBatch(m, body), body));
          break;
        default:
          body.getReferenceManager().release();
          throw new IOException(
              "unexpected Arrow message of type " + m.headerType() + " at byte " + start);
      }
    }
  }

  private interface Deserializer<T> {
    T get() throws IOException;
  }

  /** Runs {@code d}, which takes the body's reference; gives it back if it fails first. */
  private static <T> T deserialize(Deserializer<T> d, ArrowBuf body) throws IOException {
    try {
      return d.get();
    } catch (IOException | RuntimeException e) {
      body.getReferenceManager().release();
      throw e;
    }
  }

  /** The next message's metadata (its body follows, ending at {@code pos}); null at the end. */
  private MessageMetadataResult nextMessage() throws IOException {
    if (pos + 4 > size) {
      return null;
    }
    int length = payload.getInt(pos);
    pos += 4;
    if (length == -1) { // the continuation marker of the current format
      if (pos + 4 > size) {
        return null;
      }
      length = payload.getInt(pos);
      pos += 4;
    }
    if (length == 0) {
      return null;
    }
    if (length < 0 || length > size - pos) {
      throw new IOException("corrupt Arrow stream: a message of " + length + " bytes at " + pos);
    }
    ByteBuffer metadata = payload.nioBuffer(pos, length);
    MessageMetadataResult m = MessageMetadataResult.create(metadata, length);
    pos += length;
    long bodyLength = m.getMessageBodyLength();
    if (bodyLength < 0 || bodyLength > size - pos) {
      throw new IOException("corrupt Arrow stream: a body of " + bodyLength + " bytes at " + pos);
    }
    pos += bodyLength;
    return m;
  }

  @Override
  public long bytesRead() {
    return pos;
  }

  @Override
  protected void closeReadSource() {
    if (!closed) { // ArrowReader calls this on every close()
      closed = true;
      payload.close();
    }
  }
}
