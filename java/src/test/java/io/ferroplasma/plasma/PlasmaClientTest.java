package io.ferroplasma.plasma;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.ferroplasma.plasma.exceptions.DuplicateObjectException;
import io.ferroplasma.plasma.exceptions.PlasmaClientException;
import io.ferroplasma.plasma.exceptions.PlasmaOutOfMemoryException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The Java client against a real store: first the scenario of Plasma's own Java test (Arrow 11's
 * {@code PlasmaClientTest.doTest}), written with Plasma's calls, then what Plasma's C++ client
 * tests check that its Java API can express.
 */
class PlasmaClientTest {
  private TestStore store;
  private PlasmaClient client;

  @BeforeEach
  void start() throws Exception {
    store = new TestStore("64MiB");
    client = new PlasmaClient(store.socket, "", 0);
  }

  @AfterEach
  void stop() throws Exception {
    client.close();
    store.close();
  }

  private static byte[] id(int fill) {
    byte[] id = new byte[20];
    Arrays.fill(id, (byte) fill);
    return id;
  }

  @Test
  void plasmasOwnJavaScenario() {
    int timeoutMs = 3000;
    byte[] id1 = id(1);
    byte[] value1 = new byte[20];
    Arrays.fill(value1, (byte) 11);
    client.put(id1, value1, null);
    byte[] id2 = id(2);
    byte[] value2 = new byte[20];
    Arrays.fill(value2, (byte) 12);
    client.put(id2, value2, null);

    assertArrayEquals(value1, client.get(id1, timeoutMs, false));
    assertArrayEquals(value2, client.get(id2, timeoutMs, false));
    List<byte[]> values = client.get(new byte[][] {id1, id2}, timeoutMs, false);
    assertArrayEquals(value1, values.get(0));
    assertArrayEquals(value2, values.get(1));

    assertThrows(DuplicateObjectException.class, () -> client.put(id1, value1, null));
    assertNotNull(client.hash(id1));
    assertTrue(client.contains(id2));
    assertFalse(client.contains(id(3)));
  }

  @Test
  void metadataComesBackWithItsData() {
    byte[] id = PlasmaClient.randomId();
    client.put(id, new byte[] {1, 2, 3}, new byte[] {9, 8});
    assertArrayEquals(new byte[] {9, 8}, client.get(id, 0, true));
    ObjectStoreLink.ObjectStoreData both = client.get(new byte[][] {id}, 0).get(0);
    assertArrayEquals(new byte[] {1, 2, 3}, both.data);
    assertArrayEquals(new byte[] {9, 8}, both.metadata);
    // Missing objects are nulls, after the timeout.
    long t0 = System.nanoTime();
    assertNull(client.get(id(7), 200, false));
    assertTrue(System.nanoTime() - t0 >= 150_000_000L, "get returned before its timeout");
    ObjectStoreLink.ObjectStoreData none = client.get(new byte[][] {id(7)}, 0).get(0);
    assertNull(none.data);
    assertNull(none.metadata);
    assertNull(client.hash(id(7)));
  }

  @Test
  void createWriteSealThenAnotherClientReadsTheSameBytesInPlace() throws Exception {
    byte[] id = PlasmaClient.randomId();
    ByteBuffer buf = client.create(id, 1000, null);
    assertTrue(buf.isDirect());
    assertTrue(client.contains(id), "the creator sees its unsealed object, as in Plasma");
    try (PlasmaClient other = new PlasmaClient(store.socket)) {
      assertFalse(other.contains(id));
      for (int i = 0; i < 1000; i++) {
        buf.put(i, (byte) i);
      }
      client.seal(id);
      assertTrue(other.contains(id));
      try (StoreBuffer got = other.getBuffer(id, 0)) {
        ByteBuffer data = got.data();
        assertTrue(data.isReadOnly());
        assertEquals(1000, data.remaining());
        for (int i = 0; i < 1000; i++) {
          assertEquals((byte) i, data.get(i));
        }
        assertArrayEquals(client.hash(id), got.hash());
      }
    }
    client.release(id); // the creator's reference, as Plasma's put did
    assertThrows(PlasmaClientException.class, () -> client.release(id), "released twice");
  }

  @Test
  void sealAndAbortOfObjectsNotBeingCreatedAreErrors() {
    byte[] id = PlasmaClient.randomId();
    PlasmaClientException e = assertThrows(PlasmaClientException.class, () -> client.seal(id));
    assertEquals(3, e.status(), "Plasma: object not found");
    client.create(id, 10, null);
    client.seal(id);
    assertThrows(PlasmaClientException.class, () -> client.seal(id), "a second seal");
    client.release(id);

    byte[] other = PlasmaClient.randomId();
    client.create(other, 10, null);
    client.abort(other);
    assertFalse(client.contains(other));
    client.create(other, 10, null); // the id is free again
    client.seal(other);
    client.release(other);
  }

  @Test
  void deleteOfAnObjectInUseWaitsForItsLastReference() {
    byte[] id = PlasmaClient.randomId();
    client.put(id, new byte[] {5}, null);
    ByteBuffer view = client.getObjAsByteBuffer(id, 0, false);
    assertEquals(5, view.get(0));
    client.delete(id);
    assertTrue(client.contains(id), "Plasma: true until the last reference goes");
    assertFalse(client.containsSealed(id));
    assertEquals(5, view.get(0), "the holder still reads it");
    client.release(id);
    assertFalse(client.contains(id));
    assertTrue(client.list().isEmpty());
  }

  @Test
  void listEvictAndCapacity() {
    List<byte[]> ids = new ArrayList<>();
    for (int i = 0; i < 10; i++) {
      byte[] id = PlasmaClient.randomId();
      ids.add(id);
      client.put(id, new byte[1000], null);
    }
    List<byte[]> listed = client.list();
    assertEquals(10, listed.size());
    for (byte[] id : ids) {
      assertTrue(listed.stream().anyMatch(l -> Arrays.equals(l, id)));
    }
    assertTrue(client.evict(5000) >= 5000);
    assertTrue(client.list().size() <= 5);
    assertTrue(client.capacity() >= 64L << 20 - 1);
  }

  @Test
  void aFullStoreThrowsOutOfMemoryAndSaysWhatToDo() {
    byte[] id = PlasmaClient.randomId();
    ByteBuffer held = client.create(id, 40 << 20, null);
    assertNotNull(held);
    PlasmaOutOfMemoryException e =
        assertThrows(
            PlasmaOutOfMemoryException.class,
            () -> client.create(PlasmaClient.randomId(), 40 << 20, null));
    assertEquals(4, e.status());
    assertThrows(
        PlasmaOutOfMemoryException.class,
        () -> client.put(PlasmaClient.randomId(), new byte[100 << 20], null));
    client.abort(id);
    client.put(PlasmaClient.randomId(), new byte[40 << 20], null); // room again
  }

  @Test
  void largeObjectsRoundTrip() {
    byte[] id = PlasmaClient.randomId();
    byte[] value = new byte[20 << 20];
    for (int i = 0; i < value.length; i++) {
      value[i] = (byte) (i * 31);
    }
    client.put(id, value, null);
    assertArrayEquals(value, client.get(id, 0, false));
  }

  @Test
  void aClientStartedBeforeItsStoreWaitsForIt() throws Exception {
    try (TestStore late = new TestStore("16MiB", 500);
        PlasmaClient c = new PlasmaClient(late.socket)) {
      byte[] id = PlasmaClient.randomId();
      c.put(id, new byte[] {1}, null);
      assertTrue(c.contains(id));
    }
  }

  @Test
  void misuseGetsTypedErrorsNotCrashes() {
    assertThrows(PlasmaClientException.class, () -> client.put(new byte[3], new byte[1], null));
    assertThrows(PlasmaClientException.class, () -> client.get(new byte[][] {null}, 0, false));
    assertThrows(PlasmaClientException.class, () -> client.create(id(1), -1, null));
    assertThrows(PlasmaClientException.class, () -> client.release(id(9)));

    byte[] id = PlasmaClient.randomId();
    client.put(id, new byte[] {1}, null);
    StoreBuffer buf = client.getBuffer(id, 0);
    buf.close();
    buf.close(); // a second close does nothing
    assertThrows(PlasmaClientException.class, buf::data);

    PlasmaClient c = new PlasmaClient(store.socket);
    c.close();
    c.close();
    PlasmaClientException e = assertThrows(PlasmaClientException.class, () -> c.contains(id));
    assertTrue(e.getMessage().contains("closed"), e.getMessage());
  }

  @Test
  void closeAbortsWhatTheClientWasCreatingAndGivesBackItsReferences() throws Exception {
    byte[] creating = PlasmaClient.randomId();
    byte[] viewed = PlasmaClient.randomId();
    PlasmaClient c = new PlasmaClient(store.socket);
    c.create(creating, 100, null);
    c.put(viewed, new byte[] {1}, null);
    c.getObjAsByteBuffer(viewed, 0, false);
    c.close();
    client.create(creating, 100, null); // free again: the draft was aborted
    client.abort(creating);
    client.delete(viewed);
    assertFalse(client.contains(viewed), "nobody holds it any more");
  }

  @Test
  void plasmasGetThenReleaseStillWorksAndMissingMetadataIsNull() {
    byte[] id = PlasmaClient.randomId();
    client.put(id, new byte[] {1, 2}, null);
    assertArrayEquals(new byte[] {1, 2}, client.get(id, 0, false));
    assertNull(client.get(id, 0, true), "as Plasma: no metadata is null");
    client.release(id); // what Plasma code sends after a get
    client.release(id);
    assertThrows(PlasmaClientException.class, () -> client.release(id), "one release per get");
    assertNull(client.getObjAsByteBuffer(id, 0, true));
    client.release(id);
  }

  @Test
  void closeWaitsForAGetInProgressOnAnotherThread() throws Exception {
    PlasmaClient c = new PlasmaClient(store.socket);
    StoreBuffer[] got = new StoreBuffer[1];
    Thread getter = new Thread(() -> got[0] = c.getBuffer(PlasmaClient.randomId(), 600));
    getter.start();
    Thread.sleep(100);
    long t0 = System.nanoTime();
    c.close();
    long waitedMs = (System.nanoTime() - t0) / 1_000_000;
    getter.join();
    assertNull(got[0]);
    assertTrue(waitedMs >= 300, "close returned after " + waitedMs + " ms, before the get ended");
    assertThrows(PlasmaClientException.class, () -> c.getBuffer(PlasmaClient.randomId(), 0));
  }

  @Test
  void anArraysDataIsRefusedOnceItsBufferIsClosed() {
    byte[] id = PlasmaClient.randomId();
    client.put(id, new byte[] {1}, null);
    StoreBuffer buf = client.getBuffer(id, 0);
    assertThrows(PlasmaClientException.class, buf::ndarray, "not a numpy array");
    buf.close();
    assertThrows(PlasmaClientException.class, buf::ndarray);
  }

  @Test
  void manyThreadsShareOneClient() throws Exception {
    ExecutorService pool = Executors.newFixedThreadPool(4);
    List<Future<?>> done = new ArrayList<>();
    for (int t = 0; t < 4; t++) {
      done.add(
          pool.submit(
              () -> {
                for (int i = 0; i < 200; i++) {
                  byte[] id = PlasmaClient.randomId();
                  byte[] value = ByteBuffer.allocate(8).putLong(i).array();
                  client.put(id, value, null);
                  assertArrayEquals(value, client.get(id, 1000, false));
                  client.delete(id);
                }
                return null;
              }));
    }
    for (Future<?> f : done) {
      f.get();
    }
    pool.shutdown();
    assertTrue(client.list().isEmpty());
  }
}
