package io.ferroplasma.plasma;

import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;

/**
 * The C library's calls, one native method each (src/main/c/ferroplasma_jni.c). Handles are
 * {@code long}s; several ids travel packed in one array of 20 bytes each. Internal: use {@link
 * PlasmaClient}.
 */
final class NativeStore {
  private NativeStore() {}

  /** The JNI library's name inside the jar, and on {@code java.library.path}. */
  static final String LIBRARY = "ferroplasma_jni";

  static {
    load();
  }

  /**
   * Loads the JNI library: the file named by the system property {@code ferroplasma.jni.library}
   * if set, else the copy inside this jar (extracted to a temporary file), else {@code
   * System.loadLibrary("ferroplasma_jni")} from {@code java.library.path}.
   */
  private static void load() {
    String explicit = System.getProperty("ferroplasma.jni.library");
    if (explicit != null && !explicit.isEmpty()) {
      System.load(Path.of(explicit).toAbsolutePath().toString());
      return;
    }
    String resource = "native/linux-x86_64/lib" + LIBRARY + ".so";
    try (InputStream in = NativeStore.class.getResourceAsStream(resource)) {
      if (in != null) {
        Path tmp = Files.createTempFile("lib" + LIBRARY, ".so");
        try {
          Files.copy(in, tmp, StandardCopyOption.REPLACE_EXISTING);
          System.load(tmp.toString());
        } finally {
          // Linux keeps a loaded library mapped after its file is gone.
          Files.deleteIfExists(tmp);
        }
        return;
      }
    } catch (IOException e) {
      throw new UnsatisfiedLinkError("cannot extract " + resource + " from the jar: " + e);
    }
    System.loadLibrary(LIBRARY);
  }

  static native long connect(String socketOrNull);

  static native void disconnect(long client);

  static native long capacity(long client);

  static native long create(long client, byte[] id, long size, byte[] metadata);

  static native ByteBuffer mutBuffer(long draft);

  static native long seal(long client, long draft, boolean keepReference);

  static native void abort(long client, long draft);

  static native void createAndSeal(long client, byte[] id, byte[] data, byte[] metadata);

  static native void get(
      long client, byte[] packedIds, int n, long timeoutMs, long[] out, long[] parts);

  static native void bufferParts(long buffer, long[] out);

  static native ByteBuffer wrap(long address, long size);

  static native void release(long buffer);

  static native void releaseId(long client, byte[] id);

  static native boolean contains(long client, byte[] id, boolean countDeleting);

  static native void delete(long client, byte[] packedIds, int n);

  static native long evict(long client, long numBytes);

  static native byte[] list(long client, Object[] details);

  static native byte[] hash(long buffer);

  static native void layout(long buffer, long[] out);

  static native void layoutBuffer(long buffer, int i, long[] out);

  static native String ndarray(long buffer, long[] out);

  static native long[] stats(long client);

  static native byte[] randomId();
}
