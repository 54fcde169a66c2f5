package io.gpumemd.it.takeover;

import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.LeaseResponse;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.server.fd.FdTestClient;
import io.gpumemd.server.testing.TestChannel;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;

/**
 * A tenant's process for {@link TakeOverAttackTest}, run as another uid: opens a session and
 * leases a block by plain gRPC (nothing mapped, nothing fetched), prints {@code LEASED SEGMENT},
 * and once it reads {@code fetch} on stdin asks the fd channel for that segment's descriptor
 * (what a tenant looping fetches does) and prints {@code SENT}, then what came: {@code FIRST
 * GRANTED}, {@code FIRST REFUSED CODE MESSAGE}, or {@code FIRST CLOSED} (the daemon closed the
 * connection without an answer), after which it asks once more on a new connection, as the
 * clients do, and prints {@code SECOND} and what came then.
 *
 * <p>Arguments: the daemon's gRPC socket, its fd socket.
 */
public final class PauseFetchMain {
  private PauseFetchMain() {}

  public static void main(String[] args) throws Exception {
    try (TestChannel grpc = new TestChannel("unix://" + args[0])) {
      AllocatorGrpc.AllocatorBlockingStub allocator = AllocatorGrpc.newBlockingStub(grpc.channel());
      String session = allocator.openSession(OpenSessionRequest.newBuilder().setClientName("pause-fetch")
          .setTtlSeconds(300).build())
          .getSessionId();
      LeaseResponse lease = allocator.lease(LeaseRequest.newBuilder().setSessionId(session).setDevice(0)
          .setSizeBytes(4096).build());
      long segment = lease.getHandle().getSegmentId();
      System.out.println("LEASED " + segment);
      System.out.flush();
      BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
      if (!"fetch".equals(in.readLine())) {
        return;
      }
      String first = fetch(Path.of(args[1]), session, segment, true);
      System.out.println("FIRST " + first);
      if (first.equals("CLOSED")) {
        // as the clients do with a connection that closed: once more, on a new one
        System.out.println("SECOND " + fetch(Path.of(args[1]), session, segment, false));
      }
    }
  }

  private static String fetch(Path socket, String session, long segment, boolean sayWhenSent) throws Exception {
    try (FdTestClient fd = new FdTestClient(socket)) {
      fd.send(FdRequest.newBuilder().setRequestId(1).setSessionId(session).setSegmentId(segment).build());
      if (sayWhenSent) {
        System.out.println("SENT");
        System.out.flush();
      }
      FdTestClient.Reply reply = fd.receive();
      if (reply == null) {
        return "CLOSED";
      }
      if (reply.reply().getResultCase() == FdReply.ResultCase.GRANTED) {
        FdTestClient.closeQuietly(reply.fd());
        return "GRANTED";
      }
      return "REFUSED " + reply.reply().getRefused().getCode() + " " + reply.reply().getRefused().getMessage();
    }
  }
}
