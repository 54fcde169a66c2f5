package io.gpumemd.server.fd;

import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;

/**
 * A process of another tenant on the fd channel for {@link FdPushTest}, run as another uid: it
 * binds its connection to the session of its own tenant and tries to bind it to another
 * tenant's, prints {@code BOUND own=<result> other=<result>} (the reply's result case, and the
 * refusal's code), then waits for a line on stdin and prints what was pushed to it by then,
 * read without waiting: {@code PUSHED n segments=<ids>}.
 *
 * <p>Arguments: the fd socket, the session of its tenant, the other tenant's session.
 */
public final class FdPushPeerMain {
  private FdPushPeerMain() {}

  public static void main(String[] args) throws Exception {
    try (FdTestClient client = new FdTestClient(Path.of(args[0]))) {
      String own = bind(client, 1, args[1]);
      String other = bind(client, 2, args[2]);
      System.out.println("BOUND own=" + own + " other=" + other);
      System.out.flush();
      new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
      StringBuilder segments = new StringBuilder();
      int pushed = 0;
      while (client.readable() > 0) {
        FdTestClient.Reply reply = client.receive();
        if (reply == null) {
          break;
        }
        FdTestClient.closeQuietly(reply.fd());
        if (reply.reply().getPushed() && reply.fd() >= 0) {
          pushed++;
          segments.append(segments.length() == 0 ? "" : ",").append(reply.reply().getGranted().getSegmentId());
        }
      }
      System.out.println("PUSHED " + pushed + " segments=" + segments);
    }
  }

  private static String bind(FdTestClient client, long id, String session) throws Exception {
    client.send(FdRequest.newBuilder().setRequestId(id).setSessionId(session).setBind(true).build());
    FdReply reply = client.receive().reply();
    return reply.getResultCase() == FdReply.ResultCase.REFUSED
        ? "REFUSED:" + reply.getRefused().getCode() : reply.getResultCase().name();
  }
}
