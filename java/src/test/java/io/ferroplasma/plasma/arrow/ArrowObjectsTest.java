package io.ferroplasma.plasma.arrow;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.ferroplasma.plasma.PlasmaClient;
import io.ferroplasma.plasma.StoreBuffer;
import io.ferroplasma.plasma.exceptions.PlasmaClientException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** Arrow tables through a real store: put from Java, read back in place. */
class ArrowObjectsTest {
  private Process store;
  private Path dir;
  private PlasmaClient client;
  private BufferAllocator allocator;

  @BeforeEach
  void start() throws Exception {
    String bin = System.getenv("FERROPLASMA_BIN");
    if (bin == null || bin.isEmpty()) {
      bin = Path.of(System.getProperty("user.dir"), "..", ".venv", "bin", "ferroplasma").toString();
    }
    dir = Files.createTempDirectory("fp-java-arrow");
    String socket = dir.resolve("s").toString();
    store = new ProcessBuilder(bin, "store", "--memory", "64MiB", "--socket", socket).start();
    client = new PlasmaClient(socket);
    allocator = new RootAllocator();
  }

  @AfterEach
  void stop() throws Exception {
    allocator.close(); // fails if a test leaked an Arrow buffer
    client.close();
    store.destroy();
    store.waitFor(5, TimeUnit.SECONDS);
  }

  @Test
  void aTablePutFromJavaIsReadBackInPlace() throws Exception {
    byte[] id = PlasmaClient.randomId();
    try (VectorSchemaRoot root = ArrowExchange.table(allocator, 1000)) {
      ArrowObjects.putTable(client, id, root);
    }
    try (StoreBuffer object = client.getBuffer(id, 0);
        StoreArrowReader reader = ArrowObjects.getTable(client, id, 0, allocator)) {
      VectorSchemaRoot root = reader.getVectorSchemaRoot();
      assertTrue(reader.loadNextBatch());
      assertEquals(1000, root.getRowCount());
      try (VectorSchemaRoot expected = ArrowExchange.table(allocator, 1000)) {
        for (int c = 0; c < 3; c++) {
          FieldVector got = root.getVector(c);
          FieldVector want = expected.getVector(c);
          for (int i = 0; i < 1000; i++) {
            assertEquals(want.getObject(i), got.getObject(i), "column " + c + " row " + i);
          }
          assertEquals(0, ArrowExchange.outside(got, object.address(), object.address() + object.size()));
        }
      }
      assertFalse(reader.loadNextBatch());
    }
  }

  @Test
  void theObjectStaysHeldWhileAVectorTakenFromTheReaderLives() throws Exception {
    byte[] id = PlasmaClient.randomId();
    try (VectorSchemaRoot root = ArrowExchange.table(allocator, 100)) {
      ArrowObjects.putTable(client, id, root);
    }
    FieldVector kept;
    try (StoreArrowReader reader = ArrowObjects.getTable(client, id, 0, allocator)) {
      reader.loadNextBatch();
      FieldVector v = reader.getVectorSchemaRoot().getVector(0);
      kept = v.getField().createVector(allocator);
      v.makeTransferPair(kept).transfer();
    }
    client.delete(id);
    assertTrue(client.contains(id), "a vector still reads it: the delete waits");
    assertEquals(3L, kept.getObject(1));
    kept.close();
    assertFalse(client.contains(id), "the last vector gave the object back");
  }

  @Test
  void aTablePutIntoReusedMemoryHasAWholeHeader() throws Exception {
    // Memory the store reuses is not cleared: fill some with ones, free it.
    byte[] dirty = PlasmaClient.randomId();
    byte[] ones = new byte[4 << 20];
    java.util.Arrays.fill(ones, (byte) -1);
    client.put(dirty, ones, null);
    client.delete(dirty);
    byte[] id = PlasmaClient.randomId();
    try (VectorSchemaRoot root = ArrowExchange.table(allocator, 100)) {
      ArrowObjects.putTable(client, id, root);
    }
    try (StoreBuffer object = client.getBuffer(id, 0)) {
      assertEquals(0, object.layout().bufferCount(), "the out-of-band buffer count is written");
    }
    try (StoreArrowReader reader = ArrowObjects.getTable(client, id, 0, allocator)) {
      assertTrue(reader.loadNextBatch());
      assertEquals(100, reader.getVectorSchemaRoot().getRowCount());
    }
  }

  @Test
  void closingAReaderTwiceGivesTheObjectBackOnce() throws Exception {
    byte[] id = PlasmaClient.randomId();
    try (VectorSchemaRoot root = ArrowExchange.table(allocator, 100)) {
      ArrowObjects.putTable(client, id, root);
    }
    StoreArrowReader reader = ArrowObjects.getTable(client, id, 0, allocator);
    reader.loadNextBatch();
    FieldVector v = reader.getVectorSchemaRoot().getVector(0);
    FieldVector kept = v.getField().createVector(allocator);
    v.makeTransferPair(kept).transfer();
    reader.close();
    reader.close();
    client.delete(id);
    assertTrue(client.contains(id), "the kept vector still holds the object");
    assertEquals(3L, kept.getObject(1));
    kept.close();
    assertFalse(client.contains(id));
  }

  @Test
  void objectsThatAreNotTablesAndMissingOnesAreTypedErrors() {
    byte[] raw = PlasmaClient.randomId();
    client.put(raw, new byte[] {1, 2, 3}, null);
    PlasmaClientException e =
        assertThrows(
            PlasmaClientException.class, () -> ArrowObjects.getTable(client, raw, 0, allocator));
    assertTrue(e.getMessage().contains("not an Arrow table"), e.getMessage());
    PlasmaClientException missing =
        assertThrows(
            PlasmaClientException.class,
            () -> ArrowObjects.getTable(client, PlasmaClient.randomId(), 50, allocator));
    assertEquals(3, missing.status());
    client.delete(raw);
    assertFalse(client.contains(raw), "the failed reads held nothing");
  }
}
