package io.ferroplasma.plasma;

/**
 * Where the parts of a stored object lie in this process's memory (the header Python writes,
 * docs/serialization.md): its kind, its payload and its out-of-band buffers. Valid while the
 * {@link StoreBuffer} it came from is open.
 */
public final class ObjectLayout {
  /** A pickle stream and its out-of-band buffers. */
  public static final int PICKLE = 0;

  /** An Arrow IPC stream of a table (the payload). */
  public static final int ARROW_TABLE = 1;

  /** An Arrow IPC stream of one record batch (the payload). */
  public static final int ARROW_BATCH = 2;

  /** A record batch as its Arrow buffers (what a scan lands). */
  public static final int ARROW_BUFFERS = 3;

  /** A Python {@code bytes} object (the payload). */
  public static final int BYTES = 4;

  /** A list of Python {@code str}. */
  public static final int STR_LIST = 5;

  /** A numpy array ({@link StoreBuffer#ndarray()}). */
  public static final int NDARRAY = 6;

  /** No header: bytes written with create and seal, taken as they are. */
  public static final int RAW = 255;

  private final int kind;
  private final int version;
  private final long payloadAddress;
  private final long payloadSize;
  private final long[] bufferAddresses;
  private final long[] bufferSizes;

  ObjectLayout(
      int kind, int version, long payloadAddress, long payloadSize, long[] addresses, long[] sizes) {
    this.kind = kind;
    this.version = version;
    this.payloadAddress = payloadAddress;
    this.payloadSize = payloadSize;
    this.bufferAddresses = addresses;
    this.bufferSizes = sizes;
  }

  /** One of the kinds above. */
  public int kind() {
    return kind;
  }

  /** The header's format version (0 for {@link #RAW}). */
  public int version() {
    return version;
  }

  /** The payload's address (for {@link #RAW}: the whole object). */
  public long payloadAddress() {
    return payloadAddress;
  }

  /** Bytes of payload. */
  public long payloadSize() {
    return payloadSize;
  }

  /** How many out-of-band buffers follow the payload. */
  public int bufferCount() {
    return bufferAddresses.length;
  }

  /** The address of out-of-band buffer {@code i}. */
  public long bufferAddress(int i) {
    return bufferAddresses[i];
  }

  /** Bytes of out-of-band buffer {@code i}. */
  public long bufferSize(int i) {
    return bufferSizes[i];
  }
}
