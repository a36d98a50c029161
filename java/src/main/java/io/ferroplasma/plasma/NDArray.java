package io.ferroplasma.plasma;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * A numpy array Python stored, read in place: its dtype (numpy's typestr, e.g. {@code "<f8"}),
 * shape and order, and its data as a view of the store's memory. Valid while the {@link
 * StoreBuffer} it came from is open.
 */
public final class NDArray {
  private final StoreBuffer owner;
  private final String typestr;
  private final long itemSize;
  private final long[] shape;
  private final boolean fortranOrder;
  private final long address;
  private final long size;

  NDArray(
      StoreBuffer owner,
      String typestr,
      long itemSize,
      long[] shape,
      boolean fortran,
      long address,
      long size) {
    this.owner = owner;
    this.typestr = typestr;
    this.itemSize = itemSize;
    this.shape = shape;
    this.fortranOrder = fortran;
    this.address = address;
    this.size = size;
  }

  /** numpy's typestr: byte order ({@code <}, {@code >}, {@code |}), kind and item size. */
  public String typestr() {
    return typestr;
  }

  /** Bytes per item. */
  public long itemSize() {
    return itemSize;
  }

  /** The dimensions (a copy). */
  public long[] shape() {
    return shape.clone();
  }

  /** True for Fortran order (first index fastest), false for C order. */
  public boolean isFortranOrder() {
    return fortranOrder;
  }

  /** The data's address in this process. */
  public long address() {
    return address;
  }

  /** Bytes of data. */
  public long size() {
    return size;
  }

  /**
   * The data: a read-only view of the store, in the array's byte order (at most 2 GiB: see {@link
   * #address()}).
   */
  public ByteBuffer data() {
    owner.live();
    ByteBuffer b = StoreBuffer.readOnlyView(address, size);
    return b.order(typestr.startsWith(">") ? ByteOrder.BIG_ENDIAN : ByteOrder.LITTLE_ENDIAN);
  }
}
