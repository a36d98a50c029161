package io.ferroplasma.plasma;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;

/**
 * A real store for a test: the {@code ferroplasma} command ({@code $FERROPLASMA_BIN}, else the
 * repository's {@code .venv/bin/ferroplasma}, which {@code make build} makes) on a socket in a
 * temporary directory, stopped by {@link #close()}.
 */
final class TestStore implements AutoCloseable {
  final Path dir;
  final String socket;
  private final Process process;

  TestStore(String memory) throws IOException, InterruptedException {
    this(memory, 0);
  }

  /** Starts the store after {@code delayMs} (in the background when not 0). */
  TestStore(String memory, long delayMs) throws IOException, InterruptedException {
    String bin = System.getenv("FERROPLASMA_BIN");
    if (bin == null || bin.isEmpty()) {
      bin = Path.of(System.getProperty("user.dir"), "..", ".venv", "bin", "ferroplasma").toString();
    }
    if (!new File(bin).canExecute()) {
      throw new IllegalStateException(bin + " is missing: run `make build` (or set FERROPLASMA_BIN)");
    }
    dir = Files.createTempDirectory("fp-java");
    socket = dir.resolve("store.sock").toString();
    String[] cmd = {bin, "store", "--memory", memory, "--socket", socket};
    if (delayMs > 0) {
      String line = "sleep " + (delayMs / 1000.0) + " && exec \"$@\"";
      String[] sh = new String[cmd.length + 4];
      sh[0] = "sh";
      sh[1] = "-c";
      sh[2] = line;
      sh[3] = "sh";
      System.arraycopy(cmd, 0, sh, 4, cmd.length);
      process = new ProcessBuilder(sh).redirectErrorStream(true).redirectOutput(dir.resolve("log").toFile()).start();
      return;
    }
    process = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(dir.resolve("log").toFile()).start();
    for (int i = 0; i < 500 && !Files.exists(Path.of(socket)); i++) {
      Thread.sleep(10);
    }
  }

  @Override
  public void close() {
    process.destroy();
    try {
      if (!process.waitFor(5, TimeUnit.SECONDS)) {
        process.destroyForcibly();
      }
    } catch (InterruptedException e) {
      process.destroyForcibly();
      Thread.currentThread().interrupt();
    }
  }
}
