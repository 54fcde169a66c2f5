package io.gpumemd.server.takeover;

import io.gpumemd.common.unix.Descriptors;
import io.gpumemd.common.unix.UnixSockets;
import io.gpumemd.proto.takeover.v1.State;
import io.gpumemd.proto.takeover.v1.Taken;
import io.gpumemd.proto.takeover.v1.TakeOverFrame;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.pool.IncomingSegments;
import io.gpumemd.server.pool.SegmentAhead;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * One round of a {@link Rehearsal}: a state handed over from scratch books to other scratch books
 * in this one process, the way two daemons hand it over (segments sent ahead and adopted, the
 * books written, sent over a real take-over channel pair with the descriptors of the segments
 * made since and read on a thread of its own, written again and applied to them as changes, and
 * restored).
 *
 * <p>Stateless; each call uses its own channel pair, bound for a moment at the path it is given.
 */
final class SelfHandOver {
  /** A state read off a channel, with the descriptors that came with it (the caller's). */
  private record Received(State state, int[] fds) {}

  private SelfHandOver() {}

  /**
   * The state of {@code from} handed over to {@code to}, as {@link HandOverAttempt} and a successor
   * do: its segments sent ahead and adopted (in this one process, from copies of their
   * descriptors), then the state exported, sent to this process with the descriptors of any
   * segments made since, and restored.
   */
  static void handOver(Rehearsal.Books from, Rehearsal.Books to, Path channelAt) throws IOException {
    List<SegmentAhead> ahead = from.pools().segmentsAhead();
    List<SegmentMemory> adopted = new ArrayList<>();
    try (OutgoingDescriptors descriptors = new OutgoingDescriptors(ahead)) {
      List<Integer> copies = new ArrayList<>();
      try {
        for (SegmentAhead a : ahead) {
          copies.add(Descriptors.dup(a.descriptor().number()));
        }
      } catch (IOException e) {
        copies.forEach(UnixSockets::closeQuietly);
        throw e;
      }
      TakeOver.adopt(to.backend(), TakeOverState.aheadFrame(ahead), copies, adopted);
      TakeOverState.Books books;
      TakeOverState.Books again;
      try {
        books = TakeOverState.write(from.pools(), from.registry(), descriptors);
        // Written twice, as the books sent ahead and the pause's: the second goes as the changes
        // since the first (none, here), applied to the first once it came through the channel.
        again = TakeOverState.write(from.pools(), from.registry(), descriptors);
      } catch (TakeOverRefusedException e) {
        throw new IOException(e.getMessage(), e);
      }
      State changes = StateChanges.toProto(StateChanges.between(books, again)).build();
      Received received = sendToSelf(TakeOverState.toProto(books).build(), descriptors.pending(), channelAt);
      try (IncomingSegments segments = new IncomingSegments(to.backend(), adopted, received.fds())) {
        adopted.clear(); // the segments' now
        TakeOverState.Books arrived = StateChanges.apply(TakeOverState.fromProto(received.state()),
            StateChanges.fromProto(changes));
        TakeOverState.restore(arrived, segments, to.pools(), to.registry());
      }
    } finally {
      IncomingSegments.relinquishAll(to.backend(), adopted);
      for (SegmentAhead a : ahead) {
        closeCopy(a.descriptor());
      }
    }
  }

  private static void closeCopy(SegmentFd descriptor) {
    try {
      descriptor.close();
    } catch (IOException e) {
      // a copy: the segment stays the scratch pool's
    }
  }

  /**
   * Sends {@code state} with {@code fds} (or, without any, one stand-in descriptor that is closed
   * on arrival) from one end of a fresh take-over channel to the other, and a Taken back, as
   * {@link HandOverAttempt} and {@link TakeOver} do; the state read, with the descriptors received.
   */
  private static Received sendToSelf(State state, List<Integer> fds, Path channelAt) throws IOException {
    Path at = channelAt.toAbsolutePath();
    Files.deleteIfExists(at);
    int listening = UnixSockets.listen(at.toString());
    int client;
    int server;
    try {
      client = UnixSockets.connect(at.toString(), HandOver.ANSWER_MILLIS);
      server = UnixSockets.accept(listening);
    } finally {
      UnixSockets.closeQuietly(listening);
      Files.deleteIfExists(at);
    }
    try (TakeOverChannel holder = new TakeOverChannel(server); TakeOverChannel taker = new TakeOverChannel(client)) {
      holder.timeout(HandOver.ANSWER_MILLIS);
      taker.timeout(HandOver.ANSWER_MILLIS);
      List<Integer> sent = fds.isEmpty() ? List.of(server) : fds; // a descriptor rides along, as each segment's does
      // The state is larger than a socket's buffer: the taker reads it on a thread of its own
      // while this one sends, as two daemons do. (This thread never waits reading a Unix socket
      // but for the Taken it knows is there: a successor's main thread that does is waiting for
      // the running daemon's state, which tests watch for.)
      Received[] received = new Received[1];
      IOException[] failed = new IOException[1];
      Thread reading = new Thread(() -> {
        try {
          TakeOverFrame frame = taker.receiveFromHolder();
          List<Integer> came = taker.takeFds();
          if (fds.isEmpty()) {
            came.forEach(UnixSockets::closeQuietly);
            came = List.of();
          }
          received[0] = new Received(frame.getState(), came.stream().mapToInt(Integer::intValue).toArray());
          taker.send(TakeOverFrame.newBuilder().setTaken(Taken.getDefaultInstance()).build());
        } catch (IOException e) {
          failed[0] = e;
        }
      }, "gpumemd-rehearsal-taker");
      reading.start();
      try {
        holder.sendFds(sent);
        holder.send(TakeOverFrame.newBuilder().setState(state.toBuilder().setDescriptorCount(sent.size())
            .setPid((int) ProcessHandle.current().pid())).build());
      } finally {
        join(reading);
      }
      if (failed[0] != null) {
        throw failed[0];
      }
      holder.receiveFromTaker();
      return received[0];
    }
  }

  private static void join(Thread thread) throws IOException {
    try {
      thread.join();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted while the rehearsal's state was read", e);
    }
  }
}
