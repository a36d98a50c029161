import io.ferroplasma.plasma.PlasmaClient;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;

public class Hello {
  public static void main(String[] args) {
    try (PlasmaClient client = new PlasmaClient(args[0])) {
      byte[] id = PlasmaClient.randomId();
      ByteBuffer data = client.create(id, 5, null); // the store's memory
      data.put("hello".getBytes(StandardCharsets.UTF_8));
      client.seal(id);
      client.release(id); // the creator's reference, as in Plasma

      ByteBuffer view = client.getObjAsByteBuffer(id, -1, false); // no copy
      byte[] text = new byte[view.remaining()];
      view.get(text);
      System.out.println(new String(text, StandardCharsets.UTF_8));
      client.release(id);
      client.delete(id);
    }
  }
}
