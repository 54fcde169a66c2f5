package io.gpumemd.server.fd;

import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * A tenant's process on the fd channel for {@link FdFairnessTest}, run as another uid: it opens
 * the connections its arguments name and holds them, as a careless or hostile tenant would.
 *
 * <p>Arguments: the fd socket, a session of this process's tenant, a segment it holds, then
 * {@code KIND=N} for N connections of each kind: {@code idle} (sends nothing), {@code half} (two
 * bytes of a frame), {@code idleAfterOne} (one request, its reply read, then nothing), {@code
 * halfAfterOne} (the same, then two bytes of a frame), {@code flood} (900 requests for
 * descriptors in one write, never reading a reply).
 *
 * <p>Prints {@code READY connections=N} once every connection is open and its bytes sent, then
 * waits for one line on stdin: {@code check} makes it wait (10 s at most each) until the daemon
 * has closed each connection that is not a flood (whose unread replies it leaves alone) and
 * print {@code RESULT closed=K of=N}; anything else, or the end of stdin, ends it.
 */
public final class FdTenantPeerMain {
  /** Under the 1,000-a-second burst of one connection, and far past what fills its socket buffer with replies. */
  private static final int FLOOD_REQUESTS = 900;

  private FdTenantPeerMain() {}

  public static void main(String[] args) throws Exception {
    Path socket = Path.of(args[0]);
    String session = args[1];
    long segment = Long.parseLong(args[2]);
    FdRequest request = FdRequest.newBuilder().setRequestId(1).setSessionId(session).setSegmentId(segment).build();
    List<FdTestClient> open = new ArrayList<>();
    List<FdTestClient> watched = new ArrayList<>();
    for (int i = 3; i < args.length; i++) {
      String[] kindAndCount = args[i].split("=", 2);
      String kind = kindAndCount[0];
      for (int n = Integer.parseInt(kindAndCount[1]); n > 0; n--) {
        FdTestClient client = new FdTestClient(socket);
        open.add(client);
        if (!kind.equals("flood")) {
          watched.add(client);
        }
        try {
          switch (kind) {
            case "idle" -> { }
            case "half" -> client.sendRaw(ByteBuffer.wrap(new byte[] {0, 0}));
            case "idleAfterOne" -> askOnce(client, request);
            case "halfAfterOne" -> {
              if (askOnce(client, request)) {
                client.sendRaw(ByteBuffer.wrap(new byte[] {0, 0}));
              }
            }
            case "flood" -> client.offer(flood(session, segment));
            default -> throw new IllegalArgumentException("kind: " + kind);
          }
        } catch (IOException e) {
          // closed at once (beyond a connection bound): it counts as closed
        }
      }
    }
    System.out.println("READY connections=" + open.size());
    System.out.flush();

    String line = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
    if ("check".equals(line)) {
      int closed = 0;
      for (FdTestClient client : watched) {
        try {
          closed += client.closedByDaemon() ? 1 : 0;
        } catch (IOException e) {
          // still open after 10 s
        }
      }
      System.out.println("RESULT closed=" + closed + " of=" + watched.size());
    }
    for (FdTestClient client : open) {
      client.close();
    }
  }

  /** One request and its reply (its descriptor closed); false when the daemon closed the connection instead. */
  private static boolean askOnce(FdTestClient client, FdRequest request) throws IOException {
    client.send(request);
    FdTestClient.Reply reply = client.receive();
    if (reply == null) {
      return false;
    }
    FdTestClient.closeQuietly(reply.fd());
    if (reply.reply().getResultCase() != FdReply.ResultCase.GRANTED) {
      throw new IllegalStateException("refused: " + reply.reply());
    }
    return true;
  }

  private static ByteBuffer flood(String session, long segment) {
    ByteBuffer bytes = ByteBuffer.allocateDirect(FLOOD_REQUESTS * 64);
    for (int id = 1; id <= FLOOD_REQUESTS; id++) {
      byte[] body = FdRequest.newBuilder().setRequestId(id).setSessionId(session).setSegmentId(segment).build()
          .toByteArray();
      bytes.putInt(body.length).put(body);
    }
    return bytes.flip();
  }
}
