package io.ferroplasma.plasma;

import java.util.Arrays;
import java.util.Locale;

/**
 * The per-call cost of the Java client, the same measures in every language (bench/calls.py runs
 * it): {@code CallBench SOCKET} prints one JSON line.
 */
public final class CallBench {
  private CallBench() {}

  private static final int BLOCKS = 200;
  private static final int PER_BLOCK = 100;
  private static final int BATCH = 1000;
  private static final int BATCH_REPS = 50;

  private static double median(double[] v) {
    double[] s = v.clone();
    Arrays.sort(s);
    return s[s.length / 2];
  }

  public static void main(String[] args) {
    try (PlasmaClient c = new PlasmaClient(args[0])) {
      byte[] payload = new byte[64];
      payload[0] = 1;
      byte[] single = PlasmaClient.randomId();
      c.put(single, payload, null);
      byte[][] batch = new byte[BATCH][];
      for (int i = 0; i < BATCH; i++) {
        batch[i] = PlasmaClient.randomId();
        c.put(batch[i], payload, null);
      }
      byte[][] one = {single};
      double[] t = new double[BLOCKS];
      long sink = 0;

      // Warm up the JIT on every path first, untimed.
      for (int round = 0; round < 2; round++) {
        for (int b = 0; b < BLOCKS; b++) {
          long t0 = System.nanoTime();
          for (int i = 0; i < PER_BLOCK; i++) {
            try (StoreBuffer buf = c.getBuffers(one, 0)[0]) {
              sink += buf.data().get(0);
            }
          }
          t[b] = (System.nanoTime() - t0) / (double) PER_BLOCK;
        }
      }
      double getNs = median(t);

      for (int round = 0; round < 2; round++) {
        for (int b = 0; b < BLOCKS; b++) {
          long t0 = System.nanoTime();
          for (int i = 0; i < PER_BLOCK; i++) {
            sink += c.containsSealed(single) ? 1 : 0;
          }
          t[b] = (System.nanoTime() - t0) / (double) PER_BLOCK;
        }
      }
      double containsNs = median(t);

      byte[][] fresh = new byte[PER_BLOCK][];
      for (int round = 0; round < 2; round++) {
        for (int b = 0; b < BLOCKS; b++) {
          for (int i = 0; i < PER_BLOCK; i++) {
            fresh[i] = PlasmaClient.randomId();
          }
          long t0 = System.nanoTime();
          for (byte[] id : fresh) {
            c.create(id, 64, null).put(0, (byte) 1);
            c.seal(id);
            c.release(id);
          }
          t[b] = (System.nanoTime() - t0) / (double) PER_BLOCK;
          c.delete(fresh);
        }
      }
      double createSealNs = median(t);

      double[] tb = new double[BATCH_REPS];
      for (int round = 0; round < 2; round++) {
        for (int r = 0; r < BATCH_REPS; r++) {
          long t0 = System.nanoTime();
          StoreBuffer[] got = c.getBuffers(batch, 0);
          for (StoreBuffer buf : got) {
            sink += buf.data().get(0);
            buf.close();
          }
          tb[r] = (System.nanoTime() - t0) / 1e3;
        }
      }
      double batchUs = median(tb);

      c.delete(batch);
      c.delete(single);
      System.out.println(
          String.format(
              Locale.ROOT,
              "{\"get_ns\": %.1f, \"contains_ns\": %.1f, \"create_seal_ns\": %.1f, \"batch_us\": %.2f}",
              getNs,
              containsNs,
              createSealNs,
              batchUs));
      if (sink == 42) {
        System.err.println();
      }
    }
  }
}
