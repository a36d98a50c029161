package io.ferroplasma.plasma;

import java.util.List;

/**
 * Plasma's Java interface to an object store ({@code org.apache.arrow.plasma.ObjectStoreLink} of
 * Arrow 11), with the same methods: code written against it ports by changing its imports from
 * {@code org.apache.arrow.plasma} to {@code io.ferroplasma.plasma}.
 */
public interface ObjectStoreLink {

  /** An object's data and metadata, copied out of the store ({@code null}s if not available). */
  class ObjectStoreData {
    /** The metadata, or {@code null} (none, or the object was not available). */
    public final byte[] metadata;

    /** The data, or {@code null} if the object was not available in time. */
    public final byte[] data;

    /** A pair, as Plasma built it. */
    public ObjectStoreData(byte[] metadata, byte[] data) {
      this.data = data;
      this.metadata = metadata;
    }
  }

  /**
   * Stores {@code value} (and {@code metadata}, which may be null) under {@code objectId}, sealed.
   *
   * @throws io.ferroplasma.plasma.exceptions.DuplicateObjectException if the id is taken
   * @throws io.ferroplasma.plasma.exceptions.PlasmaOutOfMemoryException if there is no room
   */
  void put(byte[] objectId, byte[] value, byte[] metadata);

  /**
   * A copy of one object's data (or metadata), waiting up to {@code timeoutMs} (-1: forever, 0:
   * not at all) for it to be sealed; {@code null} if it was not in time.
   */
  default byte[] get(byte[] objectId, int timeoutMs, boolean isMetadata) {
    byte[][] objectIds = {objectId};
    return get(objectIds, timeoutMs, isMetadata).get(0);
  }

  /** Copies of several objects' data (or metadata); {@code null} for those not sealed in time. */
  List<byte[]> get(byte[][] objectIds, int timeoutMs, boolean isMetadata);

  /** Copies of several objects' data and metadata, in one wait. */
  List<ObjectStoreData> get(byte[][] objectIds, int timeoutMs);

  /** An 8-byte digest of the object's data and metadata; {@code null} if it is not in the store. */
  byte[] hash(byte[] objectId);

  /** Evicts unreferenced objects, least recently used first; returns the bytes freed. */
  long evict(long numBytes);

  /** Gives back a reference this client holds (after {@code seal} or a zero-copy get). */
  void release(byte[] objectId);

  /** Deletes the object: now, or when the last reference to it goes. */
  void delete(byte[] objectId);

  /** Whether the object is in the store and sealed (or being created by this client). */
  boolean contains(byte[] objectId);

  /** The ids of every object in the store. */
  List<byte[]> list();
}
