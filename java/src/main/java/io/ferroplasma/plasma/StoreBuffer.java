package io.ferroplasma.plasma;

import io.ferroplasma.plasma.exceptions.PlasmaClientException;
import java.nio.ByteBuffer;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A sealed object in the store's shared memory, read in place: {@link #data()} and {@link
 * #metadata()} are views of the store's bytes, not copies. While it is open the object is neither
 * evicted nor freed (even if deleted); {@link #close()} gives the reference back, after which the
 * views must not be read. Use with try-with-resources: a buffer never closed keeps its object in
 * the store until the client disconnects.
 */
public final class StoreBuffer implements AutoCloseable {
  private final AtomicLong handle;
  private final byte[] id;
  private final long address;
  private final long size;
  private final long metadataAddress;
  private final long metadataSize;

  StoreBuffer(long handle, byte[] id) {
    this(handle, id, parts(handle), 0);
  }

  /** A buffer whose parts the get returned: {@code parts[at..at+3]}. */
  StoreBuffer(long handle, byte[] id, long[] parts, int at) {
    this.handle = new AtomicLong(handle);
    this.id = id;
    this.address = parts[at];
    this.size = parts[at + 1];
    this.metadataAddress = parts[at + 2];
    this.metadataSize = parts[at + 3];
  }

  private static long[] parts(long handle) {
    long[] parts = new long[4];
    NativeStore.bufferParts(handle, parts);
    return parts;
  }

  /** The object's id (20 bytes; a copy). */
  public byte[] id() {
    return id.clone();
  }

  /** The address of the object's data in this process (for Arrow and other native readers). */
  public long address() {
    return address;
  }

  /** Bytes of data. */
  public long size() {
    return size;
  }

  /** The data: a read-only view of the store's memory (at most 2 GiB: see {@link #address()}). */
  public ByteBuffer data() {
    return view(address, size);
  }

  /** The metadata: a read-only view of the store's memory (empty if there is none). */
  public ByteBuffer metadata() {
    return view(metadataAddress, metadataSize);
  }

  /** An 8-byte digest of data and metadata (BLAKE2b, the same as every other client's hash). */
  public synchronized byte[] hash() {
    return NativeStore.hash(live());
  }

  /** Where the parts of an object Python (or {@code ArrowObjects}) stored lie. */
  public synchronized ObjectLayout layout() {
    long h = live();
    long[] head = new long[5];
    NativeStore.layout(h, head);
    int n = (int) head[4];
    long[] addresses = new long[n];
    long[] sizes = new long[n];
    long[] one = new long[2];
    for (int i = 0; i < n; i++) {
      NativeStore.layoutBuffer(h, i, one);
      addresses[i] = one[0];
      sizes[i] = one[1];
    }
    return new ObjectLayout((int) head[0], (int) head[1], head[2], head[3], addresses, sizes);
  }

  /** The numpy array Python stored in this object ({@link ObjectLayout#NDARRAY}), in place. */
  public synchronized NDArray ndarray() {
    long[] out = new long[5 + 32];
    String typestr = NativeStore.ndarray(live(), out);
    long[] shape = new long[(int) out[1]];
    System.arraycopy(out, 5, shape, 0, shape.length);
    return new NDArray(this, typestr, out[0], shape, out[2] != 0, out[3], out[4]);
  }

  /** Whether {@link #close()} has run. */
  public boolean isClosed() {
    return handle.get() == 0;
  }

  /** Gives the object's reference back; a second close does nothing. */
  @Override
  public synchronized void close() {
    long h = handle.getAndSet(0);
    if (h != 0) {
      NativeStore.release(h);
    }
  }

  long live() {
    long h = handle.get();
    if (h == 0) {
      throw new PlasmaClientException("this buffer was closed (its reference given back)");
    }
    return h;
  }

  private ByteBuffer view(long at, long length) {
    live();
    return readOnlyView(at, length);
  }

  /** A read-only ByteBuffer over {@code length} bytes at {@code at}: at most 2 GiB. */
  static ByteBuffer readOnlyView(long at, long length) {
    if (length > Integer.MAX_VALUE) {
      throw new PlasmaClientException(
          "the object is " + length + " bytes, more than one ByteBuffer holds: use address()");
    }
    return NativeStore.wrap(at, length).asReadOnlyBuffer();
  }
}
