package io.ferroplasma.plasma;

import io.ferroplasma.plasma.exceptions.DuplicateObjectException;
import io.ferroplasma.plasma.exceptions.PlasmaClientException;
import io.ferroplasma.plasma.exceptions.PlasmaOutOfMemoryException;
import java.nio.ByteBuffer;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.locks.ReentrantReadWriteLock;
import java.util.function.LongFunction;

/**
 * A client of a ferroplasma store, in the shape of Plasma's Java client ({@code
 * org.apache.arrow.plasma.PlasmaClient} of Arrow 11): the same constructor and methods, so Plasma
 * code ports by changing its imports to {@code io.ferroplasma.plasma}. Ids are 20-byte arrays.
 *
 * <p>Reads of sealed objects in the store's memory do not ask the store (docs/protocol.md), as in
 * every ferroplasma client. The zero-copy calls ({@link #getBuffers}, {@link #getObjAsByteBuffer},
 * {@link #create}) hand out views of shared memory; the copying ones ({@link #get(byte[][], int,
 * boolean)}) return {@code byte[]}s.
 *
 * <p>A client may be used from several threads; {@link #close()} waits for calls in progress on
 * other threads (a get waiting without a timeout keeps it waiting). Close it when done (or use
 * try-with-resources): it aborts objects still being created and gives back every reference it
 * holds by id.
 *
 * <pre>{@code
 * try (PlasmaClient client = new PlasmaClient("/tmp/plasma")) {
 *   byte[] id = PlasmaClient.randomId();
 *   client.put(id, "hello".getBytes(), null);
 *   byte[] value = client.get(id, 1000, false); // a copy; getBuffers() reads in place
 * }
 * }</pre>
 */
public class PlasmaClient implements ObjectStoreLink, AutoCloseable {
  private volatile long handle;
  /**
   * Calls hold the read side while they use the C library's client; {@link #close()} takes the
   * write side, so it waits for calls in progress on other threads before disconnecting.
   */
  private final ReentrantReadWriteLock inUse = new ReentrantReadWriteLock();
  /** Ids this client read with a copying get lately, whose {@code release} Plasma code sends. */
  private final RecentIds copied = new RecentIds(4096);
  /** Objects this client is creating: id → the C library's draft handle. */
  private final Map<ByteBuffer, Long> drafts = new HashMap<>();
  /** References this client holds by id (from seal and getObjAsByteBuffer), released by id. */
  private final Map<ByteBuffer, ArrayDeque<Held>> held = new HashMap<>();

  /** A reference held by id: the buffer, and whether seal made it (the creator's reference). */
  private static final class Held {
    final StoreBuffer buffer;
    final boolean creator;

    Held(StoreBuffer buffer, boolean creator) {
      this.buffer = buffer;
      this.creator = creator;
    }
  }

  /**
   * Plasma's constructor. {@code managerSocketName} and {@code releaseDelay} are Plasma's and
   * ignored (Plasma 11 ignored them too).
   *
   * @param storeSocketName the store's socket ({@code ferroplasma store --socket}); null or empty
   *     for the default ({@code $FERROPLASMA_SOCKET}, else {@code /tmp/ferroplasma.sock})
   * @throws PlasmaClientException if no store answers there (Plasma's client retried for a
   *     while, and so does this one: about 8 s)
   */
  public PlasmaClient(String storeSocketName, String managerSocketName, int releaseDelay) {
    this(storeSocketName);
  }

  /** Connects to the store at {@code storeSocketName} (null or empty: the default socket). */
  public PlasmaClient(String storeSocketName) {
    String path = storeSocketName == null || storeSocketName.isEmpty() ? null : storeSocketName;
    this.handle = connectWithRetries(path);
  }

  private static long connectWithRetries(String path) {
    for (int attempt = 0; ; attempt++) {
      try {
        return NativeStore.connect(path);
      } catch (PlasmaClientException e) {
        // FP_STORE_UNAVAILABLE: the store may be starting, as Plasma's num_retries allowed.
        if (e.status() != 1 || attempt >= 80) {
          throw e;
        }
      }
      try {
        Thread.sleep(100);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new PlasmaClientException(14, "interrupted while connecting to " + path);
      }
    }
  }

  /** A random 20-byte id, unique across the cluster with overwhelming probability. */
  public static byte[] randomId() {
    return NativeStore.randomId();
  }

  // Plasma's calls ---------------------------------------------------------

  /**
   * Stores {@code value} under {@code objectId}, sealed, in one call; keeps no reference.
   *
   * @throws DuplicateObjectException if the id is taken
   * @throws PlasmaOutOfMemoryException if there is no room
   */
  @Override
  public void put(byte[] objectId, byte[] value, byte[] metadata) {
    run(h -> NativeStore.createAndSeal(h, objectId, value, metadata));
  }

  @Override
  public List<byte[]> get(byte[][] objectIds, int timeoutMs, boolean isMetadata) {
    StoreBuffer[] bufs = getBuffers(objectIds, timeoutMs);
    List<byte[]> out = new ArrayList<>(bufs.length);
    for (int i = 0; i < bufs.length; i++) {
      if (bufs[i] == null) {
        out.add(null);
        continue;
      }
      copied.add(objectIds[i]);
      try (StoreBuffer buf = bufs[i]) {
        ByteBuffer part = isMetadata ? buf.metadata() : buf.data();
        // As Plasma: no metadata is null, not an empty array.
        out.add(isMetadata && !part.hasRemaining() ? null : copyOf(part));
      }
    }
    return out;
  }

  @Override
  public List<ObjectStoreData> get(byte[][] objectIds, int timeoutMs) {
    StoreBuffer[] bufs = getBuffers(objectIds, timeoutMs);
    List<ObjectStoreData> out = new ArrayList<>(bufs.length);
    for (int i = 0; i < bufs.length; i++) {
      if (bufs[i] == null) {
        out.add(new ObjectStoreData(null, null));
        continue;
      }
      copied.add(objectIds[i]);
      try (StoreBuffer buf = bufs[i]) {
        byte[] meta = buf.metadata().remaining() == 0 ? null : copyOf(buf.metadata());
        out.add(new ObjectStoreData(meta, copyOf(buf.data())));
      }
    }
    return out;
  }

  /**
   * Plasma's zero-copy get: the object's data (or metadata; {@code null} if it has none) as a
   * read-only view of the store, or {@code null} if it was not sealed in time. As in Plasma, the
   * client holds the object until {@link #release(byte[])} of its id.
   */
  public ByteBuffer getObjAsByteBuffer(byte[] objectId, int timeoutMs, boolean isMetadata) {
    StoreBuffer b = getBuffers(new byte[][] {objectId}, timeoutMs)[0];
    if (b == null) {
      return null;
    }
    hold(objectId, new Held(b, false));
    if (isMetadata) {
      ByteBuffer m = b.metadata();
      return m.hasRemaining() ? m : null; // as Plasma: no metadata is null
    }
    return b.data();
  }

  @Override
  public byte[] hash(byte[] objectId) {
    StoreBuffer b = getBuffers(new byte[][] {objectId}, 0)[0];
    if (b == null) {
      return null;
    }
    try (StoreBuffer buf = b) {
      return buf.hash();
    }
  }

  @Override
  public List<byte[]> list() {
    byte[] packed = call(h -> NativeStore.list(h, null));
    List<byte[]> ids = new ArrayList<>(packed.length / 20);
    for (int i = 0; i < packed.length; i += 20) {
      byte[] id = new byte[20];
      System.arraycopy(packed, i, id, 0, 20);
      ids.add(id);
    }
    return ids;
  }

  @Override
  public long evict(long numBytes) {
    return call(h -> NativeStore.evict(h, numBytes));
  }

  /**
   * Creates an object of {@code size} bytes and returns its memory, writable, a view of the store.
   * Write it, then {@link #seal(byte[])} it (or {@link #abort(byte[])}).
   *
   * @throws DuplicateObjectException if the id is taken
   * @throws PlasmaOutOfMemoryException if there is no room
   */
  public ByteBuffer create(byte[] objectId, int size, byte[] metadata) {
    long draft = call(h -> NativeStore.create(h, objectId, size, metadata));
    synchronized (this) {
      drafts.put(key(objectId), draft);
    }
    return NativeStore.mutBuffer(draft);
  }

  /**
   * Seals an object this client created: it becomes immutable and visible to every client. As in
   * Plasma, the creator then holds a reference until {@link #release(byte[])}.
   */
  public void seal(byte[] objectId) {
    long draft = takeDraft(objectId, "seal");
    long buffer = call(h -> NativeStore.seal(h, draft, true));
    hold(objectId, new Held(new StoreBuffer(buffer, objectId.clone()), true));
  }

  /** Discards an object this client is creating; its id becomes free again. */
  public void abort(byte[] objectId) {
    long draft = takeDraft(objectId, "abort");
    run(h -> NativeStore.abort(h, draft));
  }

  /**
   * Gives back one reference this client holds on the object (from {@link #seal} or {@link
   * #getObjAsByteBuffer}).
   *
   * @throws PlasmaClientException with status {@code FP_NOT_HELD} (9) if it holds none
   */
  @Override
  public void release(byte[] objectId) {
    Held h = null;
    synchronized (this) {
      ArrayDeque<Held> q = held.get(key(objectId));
      if (q != null) {
        h = q.poll();
        if (q.isEmpty()) {
          held.remove(key(objectId));
        }
      }
    }
    if (h == null) {
      if (copied.remove(objectId)) {
        return; // Plasma's get held the object until this release; the copying get held nothing
      }
      run(c -> NativeStore.releaseId(c, objectId)); // FP_NOT_HELD unless a StoreBuffer holds it
      return;
    }
    h.buffer.close();
    if (h.creator) {
      // The C library remembers that the creator's reference ended with its buffer and takes an
      // explicit release of it as a no-op; this is that release, so a second one is an error.
      run(c -> NativeStore.releaseId(c, objectId));
    }
  }

  /** Deletes the object: now, or, if it is in use, when the last reference goes. */
  @Override
  public void delete(byte[] objectId) {
    delete(new byte[][] {objectId});
  }

  /**
   * Whether the object is in the store and sealed, or being created by this client; an object
   * whose delete waits for its last reference counts until then, as in Plasma.
   */
  @Override
  public boolean contains(byte[] objectId) {
    synchronized (this) {
      if (drafts.containsKey(key(objectId))) {
        return true;
      }
    }
    return call(h -> NativeStore.contains(h, objectId, true));
  }

  /** Closes the connection: Plasma's disconnect, the same as {@link #close()}. */
  public void disconnect() {
    close();
  }

  // ferroplasma's calls ------------------------------------------------------

  /**
   * Gets several objects in place, waiting up to {@code timeoutMs} (negative: forever, 0: not at
   * all) for those not sealed yet. Each non-null result is a view of the store that holds its
   * object until closed; {@code null} for an object not sealed in time.
   */
  public StoreBuffer[] getBuffers(byte[][] objectIds, long timeoutMs) {
    int n = objectIds.length;
    long[] handles = new long[n];
    long[] parts = new long[4 * n];
    byte[] packed = pack(objectIds);
    run(h -> NativeStore.get(h, packed, n, timeoutMs, handles, parts));
    StoreBuffer[] out = new StoreBuffer[n];
    for (int i = 0; i < n; i++) {
      if (handles[i] != 0) {
        out[i] = new StoreBuffer(handles[i], objectIds[i].clone(), parts, 4 * i);
      }
    }
    return out;
  }

  /** One object in place ({@link #getBuffers}); {@code null} if not sealed in time. */
  public StoreBuffer getBuffer(byte[] objectId, long timeoutMs) {
    return getBuffers(new byte[][] {objectId}, timeoutMs)[0];
  }

  /** Deletes several objects in one call. */
  public void delete(byte[][] objectIds) {
    byte[] packed = pack(objectIds);
    run(h -> NativeStore.delete(h, packed, objectIds.length));
  }

  /** Whether the object is sealed in the store, false once a delete of it is pending. */
  public boolean containsSealed(byte[] objectId) {
    return call(h -> NativeStore.contains(h, objectId, false));
  }

  /** The store's capacity in bytes. */
  public long capacity() {
    return call(NativeStore::capacity);
  }

  /**
   * Aborts the objects this client is still creating, gives back every reference it holds by id,
   * and closes the connection. Buffers from {@link #getBuffers} stay valid until closed. A second
   * close does nothing.
   */
  @Override
  public void close() {
    inUse.writeLock().lock(); // waits for calls in progress on other threads
    try {
      long h;
      List<Long> toAbort;
      List<StoreBuffer> toRelease = new ArrayList<>();
      synchronized (this) {
        h = handle;
        if (h == 0) {
          return;
        }
        handle = 0;
        toAbort = new ArrayList<>(drafts.values());
        drafts.clear();
        held.values().forEach(q -> q.forEach(x -> toRelease.add(x.buffer)));
        held.clear();
      }
      try {
        for (long draft : toAbort) {
          try {
            NativeStore.abort(h, draft);
          } catch (PlasmaClientException e) {
            // The store aborts a leaving client's drafts anyway.
          }
        }
        for (StoreBuffer b : toRelease) {
          try {
            b.close();
          } catch (PlasmaClientException e) {
            // Closed already by its user: nothing held.
          }
        }
      } finally {
        NativeStore.disconnect(h);
      }
    } finally {
      inUse.writeLock().unlock();
    }
  }

  // helpers ------------------------------------------------------------------

  /** Runs {@code f} on the live client, which {@link #close()} cannot free meanwhile. */
  private <T> T call(LongFunction<T> f) {
    inUse.readLock().lock();
    try {
      return f.apply(live());
    } finally {
      inUse.readLock().unlock();
    }
  }

  private interface ClientCall {
    void run(long client);
  }

  private void run(ClientCall f) {
    inUse.readLock().lock();
    try {
      f.run(live());
    } finally {
      inUse.readLock().unlock();
    }
  }

  long live() {
    long h = handle;
    if (h == 0) {
      throw new PlasmaClientException("this client was closed: make a new PlasmaClient");
    }
    return h;
  }

  private synchronized long takeDraft(byte[] objectId, String what) {
    Long draft = drafts.remove(key(objectId));
    if (draft == null) {
      throw new PlasmaClientException(
          3, "cannot " + what + " " + hex(objectId) + ": this client is not creating it");
    }
    return draft;
  }

  private synchronized void hold(byte[] objectId, Held b) {
    held.computeIfAbsent(key(objectId), k -> new ArrayDeque<>()).add(b);
  }

  private static ByteBuffer key(byte[] objectId) {
    if (objectId == null || objectId.length != 20) {
      throw new PlasmaClientException(
          "an object id is 20 bytes, got " + (objectId == null ? "null" : objectId.length));
    }
    return ByteBuffer.wrap(objectId.clone());
  }

  private static byte[] pack(byte[][] objectIds) {
    byte[] packed = new byte[objectIds.length * 20];
    for (int i = 0; i < objectIds.length; i++) {
      byte[] id = objectIds[i];
      if (id == null || id.length != 20) {
        throw new PlasmaClientException(
            "object id " + i + " is not 20 bytes (" + (id == null ? "null" : id.length) + ")");
      }
      System.arraycopy(id, 0, packed, i * 20, 20);
    }
    return packed;
  }

  private static byte[] copyOf(ByteBuffer view) {
    byte[] out = new byte[view.remaining()];
    view.get(out);
    return out;
  }

  /** An id as 40 lowercase hex digits. */
  public static String hex(byte[] objectId) {
    StringBuilder s = new StringBuilder(40);
    for (byte b : objectId) {
      s.append(Character.forDigit((b >> 4) & 0xf, 16)).append(Character.forDigit(b & 0xf, 16));
    }
    return s.toString();
  }

  /** The id written as 40 hex digits. */
  public static byte[] idFromHex(String hex) {
    if (hex == null || hex.length() != 40) {
      throw new PlasmaClientException("an object id is 40 hex digits, got: " + hex);
    }
    byte[] id = new byte[20];
    for (int i = 0; i < 20; i++) {
      int hi = Character.digit(hex.charAt(2 * i), 16);
      int lo = Character.digit(hex.charAt(2 * i + 1), 16);
      if (hi < 0 || lo < 0) {
        throw new PlasmaClientException("not a hex digit in object id " + hex);
      }
      id[i] = (byte) (hi << 4 | lo);
    }
    return id;
  }
}
