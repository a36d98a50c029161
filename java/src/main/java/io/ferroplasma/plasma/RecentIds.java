package io.ferroplasma.plasma;

import java.nio.ByteBuffer;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Ids a client read with a copying get lately, counted, the oldest forgotten past a bound. Plasma's
 * Java get held each object until {@code release(id)}; ferroplasma's copying gets hold nothing, and
 * this lets the {@code release} that Plasma code sends after them succeed instead of failing with
 * "not held", without keeping a record per object of a client that reads millions.
 */
final class RecentIds {
  private final int bound;
  private final LinkedHashMap<ByteBuffer, Integer> counts;

  RecentIds(int bound) {
    this.bound = bound;
    this.counts =
        new LinkedHashMap<>(16, 0.75f, false) {
          private static final long serialVersionUID = 1L;

          @Override
          protected boolean removeEldestEntry(Map.Entry<ByteBuffer, Integer> eldest) {
            return size() > RecentIds.this.bound;
          }
        };
  }

  /** One more copying get of {@code id}. */
  synchronized void add(byte[] id) {
    counts.merge(ByteBuffer.wrap(id.clone()), 1, Integer::sum);
  }

  /** Takes one get of {@code id} back: false if none is remembered. */
  synchronized boolean remove(byte[] id) {
    ByteBuffer key = ByteBuffer.wrap(id);
    Integer n = counts.get(key);
    if (n == null) {
      return false;
    }
    if (n == 1) {
      counts.remove(key);
    } else {
      counts.put(key, n - 1);
    }
    return true;
  }
}
