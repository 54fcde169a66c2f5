package io.gpumemd.server.testing;

import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.grpc.Channel;
import io.grpc.stub.StreamObserver;
import java.util.concurrent.BlockingQueue;

/**
 * A session's KeepAlive stream spoken by hand, as a test's client: opened on a channel, its first
 * message attaches the session, and every event the daemon sends is put on a queue the test
 * reads. Thread-safe as the queue is.
 */
public final class EventStream {
  private EventStream() {}

  /**
   * Opens the stream and sends its first message.
   *
   * @param events where the daemon's events go, in order
   * @return the stream's request side
   */
  public static StreamObserver<KeepAliveRequest> attach(Channel channel, String sessionId,
      BlockingQueue<SessionEvent> events) {
    StreamObserver<KeepAliveRequest> requests = AllocatorGrpc.newStub(channel).keepAlive(new StreamObserver<>() {
      @Override
      public void onNext(SessionEvent event) {
        events.add(event);
      }

      @Override
      public void onError(Throwable t) {}

      @Override
      public void onCompleted() {}
    });
    requests.onNext(KeepAliveRequest.newBuilder().setSessionId(sessionId).build());
    return requests;
  }
}
