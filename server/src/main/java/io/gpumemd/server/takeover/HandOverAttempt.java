package io.gpumemd.server.takeover;

import io.gpumemd.common.unix.UnixSockets;
import io.gpumemd.proto.takeover.v1.Abort;
import io.gpumemd.proto.takeover.v1.Hello;
import io.gpumemd.proto.takeover.v1.Refusal;
import io.gpumemd.proto.takeover.v1.State;
import io.gpumemd.proto.takeover.v1.TakeOverFrame;
import io.gpumemd.server.pool.SegmentAhead;
import java.io.EOFException;
import java.io.IOException;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One successor's attempt to take over, on the running daemon's side: the protocol of {@link
 * HandOver}, one method per step, in order: {@link #greet} (its uid and Hello, and whether this
 * daemon's state fits it), {@link #sendAhead} (where the successor takes them: the segments'
 * descriptors, adopted while this daemon serves on), {@link #quiesce} (the gate closes,
 * requests in progress finish), {@link #sendState} (the descriptors of segments made since, and
 * the books), {@link #awaitAnswer} (Taken, Abort, or {@link
 * #giveUp}), {@link #awaitLive} (the successor serves). Every step that ends the attempt before
 * Taken leaves the gate open and the daemon serving, and tells the successor why ({@link
 * #refuse}) once it may hold the state.
 *
 * <p>Logs under {@link HandOver}'s name, as it always has. Used once, by the hand-over thread.
 */
final class HandOverAttempt {
  private static final Logger log = LoggerFactory.getLogger(HandOver.class);

  private final TakeOverChannel channel;
  private final HandOverGate gate;
  private final HandOver.Daemon daemon;
  private final String version;
  private final int uid;
  private final BooleanSupplier closing;
  private final Runnable taken;
  private int pid;
  private long started;
  /** The segments' descriptors sent so far and to send next (none sent ahead: none yet). */
  private OutgoingDescriptors descriptors = new OutgoingDescriptors(List.of());
  /** The books sent ahead of the pause, or null: the state then goes whole. */
  private TakeOverState.Books booksAhead;

  HandOverAttempt(TakeOverChannel channel, HandOverGate gate, HandOver.Daemon daemon, String version, int uid,
      BooleanSupplier closing, Runnable taken) {
    this.channel = channel;
    this.gate = gate;
    this.daemon = daemon;
    this.version = version;
    this.uid = uid;
    this.closing = closing;
    this.taken = taken;
  }

  /**
   * Runs the attempt to its end; {@code taken} runs as soon as the successor's Taken is read,
   * before the daemon is told to stop.
   */
  void run() {
    Hello hello = greet();
    if (hello == null) {
      return;
    }
    // The successor is of this uid, but a name that is not a plain file name is not passed on.
    boolean told = UnixSockets.isSocketFileName(hello.getServingAt());
    if (told) {
      // First: the clients connect there while this daemon rehearses and sends the segments.
      daemon.successorAt(hello.getServingAt());
    }
    if (!handOver(hello)) {
      if (told) {
        daemon.successorGone(); // the clients' connections to it would retry a socket going away
      }
      return;
    }
    taken.run();
    log.info("Handed over to pid {} after {} ms: its state is the successor's now", pid,
        (System.nanoTime() - started) / 1_000_000);
    awaitLive();
    daemon.handedOver(pid);
  }

  /** The steps up to the successor's Taken; false when the attempt ended before it (this daemon serves on). */
  private boolean handOver(Hello hello) {
    daemon.rehearse();
    if (hello.getTakesSegmentsAhead() && !sendAhead()) {
      return false;
    }
    if (hello.getTakesSegmentsAhead() && hello.getTakesStateAhead() && !sendBooksAhead()) {
      return false;
    }
    // The rehearsal and the segments sent ahead compiled code of their own: the pause, which
    // closing the gate starts, should not share the cores with that compilation.
    CompilerQuiet.beforePause();
    return quiesce(hello) && sendState() && awaitAnswer() != null;
  }

  /** The successor's uid and Hello; null when refused (it was told why) or gone. */
  private Hello greet() {
    Hello hello;
    try {
      int[] peer = channel.peer();
      pid = peer[0];
      channel.timeout(HandOver.HELLO_MILLIS);
      if (peer[1] != uid) {
        log.warn("Take-over refused: pid {} runs as uid {}, and only this daemon's uid {} may take over", peer[0],
            peer[1], uid);
        refuse("the take-over socket serves only uid " + uid + " (the daemon's own); this process runs as uid "
            + peer[1]);
        return null;
      }
      TakeOverFrame first = channel.receiveFromTaker();
      if (!first.hasHello()) {
        log.warn("Take-over refused: pid {} did not start with a Hello", pid);
        return null;
      }
      hello = first.getHello();
    } catch (IOException e) {
      log.warn("Take-over attempt ended before it began: {}", e.getMessage());
      return null;
    }
    String refusal = daemon.refusal(hello);
    if (refusal != null) {
      log.warn("Take-over by pid {} (gpumemd {}) refused: {}; serving on", pid, hello.getVersion(), refusal);
      refuse(refusal);
      return null;
    }
    if (closing.getAsBoolean()) {
      refuse("this daemon is shutting down");
      return null;
    }
    return hello;
  }

  /**
   * Sends every segment's descriptor ahead of the state while this daemon serves on, and waits
   * until the successor has adopted them (its Ready): the pause then carries only the segments
   * made since, and the successor adopts only those inside it. False when the successor aborted,
   * went away or did not answer in time: this daemon serves on (its gate never closed).
   */
  private boolean sendAhead() {
    long began = System.nanoTime();
    List<SegmentAhead> ahead = daemon.segmentsAhead();
    try {
      channel.deadline(began + TimeUnit.MILLISECONDS.toNanos(HandOver.ANSWER_MILLIS));
      channel.sendFds(ahead.stream().map(a -> a.descriptor().number()).toList());
      channel.send(TakeOverFrame.newBuilder().setSegmentsAhead(TakeOverState.aheadFrame(ahead)).build());
      TakeOverFrame answer = channel.receiveFromTaker();
      if (!answer.hasReady()) {
        log.warn("Take-over by pid {} ended before the gate closed: {}; serving on", pid, answer.hasAbort()
            ? "it could not adopt the segments sent ahead (" + answer.getAbort().getReason() + ")"
            : "it answered " + answer.getFrameCase() + " to the segments sent ahead");
        return false;
      }
    } catch (IOException e) {
      String why = TakeOverChannel.timedOut(e) ? "no answer within " + HandOver.ANSWER_MILLIS + " ms" : e.getMessage();
      log.warn("Take-over by pid {} ended before the gate closed, while its segments were sent ahead ({}); "
          + "serving on", pid, why);
      return false;
    } finally {
      for (SegmentAhead a : ahead) {
        try {
          a.descriptor().close();
        } catch (IOException e) {
          log.warn("Cannot close a segment descriptor sent ahead: {}", e.toString());
        }
      }
    }
    descriptors = new OutgoingDescriptors(ahead);
    log.info("Take-over by pid {}: {} segment descriptor(s) sent ahead, adopted after {} ms", pid, ahead.size(),
        (System.nanoTime() - began) / 1_000_000);
    return true;
  }

  /** Closes the gate and waits for the requests in progress; false (gate open again) when they do not end. */
  private boolean quiesce(Hello hello) {
    log.info("Take-over asked by pid {} (gpumemd {}): no longer applying requests", pid, hello.getVersion());
    started = System.nanoTime();
    return closeGate();
  }

  /** Closes the gate and waits for the requests in progress; false (gate open again, the successor told) when they do not end. */
  private boolean closeGate() {
    int left;
    try {
      left = gate.closeForHandOver(HandOver.QUIESCE_MILLIS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      gate.open();
      return false;
    }
    if (left > 0) {
      gate.open();
      String reason = left + " request(s) still running after " + HandOver.QUIESCE_MILLIS + " ms; try again";
      log.warn("Take-over by pid {} refused: {}; serving on", pid, reason);
      refuse(reason);
      return false;
    }
    return true;
  }

  /**
   * Writes the books down with the gate closed only for that (requests that came meanwhile are
   * answered "moving" when it opens, and called again here), then sends them while serving, and
   * waits for the successor to have read them. The pause that follows carries only what changed
   * since. False when they cannot be written or sent, or the successor did not take them: this
   * daemon serves on.
   */
  private boolean sendBooksAhead() {
    long began = System.nanoTime();
    if (!closeGate()) {
      return false;
    }
    TakeOverState.Books books;
    try {
      books = daemon.write(descriptors);
    } catch (TakeOverRefusedException | RuntimeException e) {
      gate.open();
      descriptors.sent();
      refuseUnwritten(e);
      return false;
    }
    gate.open();
    long paused = System.nanoTime() - began;
    try {
      channel.deadline(System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(HandOver.ANSWER_MILLIS));
      List<Integer> fds = descriptors.pending();
      channel.sendFds(fds);
      channel.send(TakeOverFrame.newBuilder().setStateAhead(TakeOverState.toProto(books).setDescriptorCount(fds.size())
          .setVersion(version).setPid((int) ProcessHandle.current().pid())).build());
      TakeOverFrame answer = channel.receiveFromTaker();
      if (!answer.hasReady()) {
        log.warn("Take-over by pid {} ended before the pause: {}; serving on", pid, answer.hasAbort()
            ? "it could not read the books sent ahead (" + answer.getAbort().getReason() + ")"
            : "it answered " + answer.getFrameCase() + " to the books sent ahead");
        return false;
      }
    } catch (IOException e) {
      String why = TakeOverChannel.timedOut(e) ? "no answer within " + HandOver.ANSWER_MILLIS + " ms" : e.getMessage();
      log.warn("Take-over by pid {} ended before the pause, while its books were sent ahead ({}); serving on", pid, why);
      return false;
    } finally {
      descriptors.sent();
    }
    booksAhead = books;
    log.info("Take-over by pid {}: books of {} leases sent ahead (written in {} ms with the gate closed), read after "
        + "{} ms", pid, books.sessions().leases().size(), paused / 1_000_000, (System.nanoTime() - began) / 1_000_000);
    return true;
  }

  /** Logs why the books could not be written, and tells the successor (the gate is open again). */
  private void refuseUnwritten(Exception e) {
    String reason = e instanceof TakeOverRefusedException ? e.getMessage()
        : "the state could not be exported (" + e.getMessage() + ")";
    if (e instanceof RuntimeException) {
      log.error("Exporting the state for a take-over failed", e);
    }
    log.warn("Take-over by pid {} refused: {}; serving on", pid, reason);
    refuse(reason);
  }

  /**
   * Writes the books down and sends them with the descriptors of segments not sent before
   * (copies, closed here once sent): whole, or after books sent ahead only what changed since.
   * False (gate open again) when they cannot be written or sent.
   */
  private boolean sendState() {
    try {
      State.Builder state;
      try {
        TakeOverState.Books books = daemon.write(descriptors);
        state = booksAhead == null ? TakeOverState.toProto(books)
            : StateChanges.toProto(StateChanges.between(booksAhead, books));
        state.addAllHiddenProcessInodes(daemon.hiddenProcesses(descriptors));
      } catch (TakeOverRefusedException | RuntimeException e) {
        gate.open();
        refuseUnwritten(e);
        return false;
      }
      // One bound for the whole rest, however the successor paces its reads and its answer.
      channel.deadline(System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(HandOver.ANSWER_MILLIS));
      List<Integer> fds = descriptors.pending();
      channel.sendFds(fds);
      TakeOverFrame frame = TakeOverFrame.newBuilder().setState(state.setDescriptorCount(fds.size())
          .setVersion(version).setPid((int) ProcessHandle.current().pid())).build();
      channel.send(frame);
      // Sending sized the frame's state and kept the figure; the exported state would be sized
      // again (a 1 MB state takes milliseconds), inside the pause.
      log.info("State sent to pid {}: {} segment descriptor(s), {} bytes of books{}, after {} ms", pid,
          fds.size(), frame.getState().getSerializedSize(), booksAhead == null ? "" : " (changes since those sent ahead)",
          (System.nanoTime() - started) / 1_000_000);
      return true;
    } catch (IOException e) {
      gate.open();
      log.warn("Take-over by pid {} failed while sending the state ({}); serving on", pid, e.getMessage());
      return false;
    } finally {
      descriptors.sent();
    }
  }

  /**
   * The successor's answer to the state: its Taken, or null when it aborted, went away, or was
   * given up (the gate is open again and this daemon serves on).
   */
  private TakeOverFrame awaitAnswer() {
    TakeOverFrame answer;
    try {
      // From here the successor may hold the whole state: any way out but its Taken goes
      // through giveUp, which tells it (see there). Still by the deadline set before the state.
      answer = channel.receiveFromTaker();
    } catch (EOFException e) {
      gate.open();
      log.warn("Take-over by pid {} failed: it went away before taking the state (connection closed); serving on",
          pid);
      return null;
    } catch (IOException e) {
      String why = TakeOverChannel.timedOut(e)
          ? "no answer within " + HandOver.ANSWER_MILLIS + " ms of the state"
          : "a broken answer (" + e.getMessage() + ")";
      answer = giveUp(why);
      if (answer == null) {
        return null;
      }
    }
    if (!answer.hasTaken()) {
      gate.open();
      Abort abort = answer.getAbort();
      log.warn("Take-over by pid {} failed: it could not restore the state ({}); serving on", pid,
          answer.hasAbort() ? abort.getReason() : "unexpected answer");
      if (!answer.hasAbort()) {
        // Never close before Taken without saying so (see giveUp).
        refuse("the running daemon expected Taken or Abort, not " + answer.getFrameCase() + ", and serves on");
      }
      return null;
    }
    return answer;
  }

  /** Waits for the successor to say it serves on the socket path; stops anyway when it does not. */
  private void awaitLive() {
    try {
      channel.timeout(HandOver.LIVE_MILLIS);
      TakeOverFrame live = channel.receiveFromTaker();
      if (!live.hasLive()) {
        log.warn("The successor (pid {}) answered {} instead of Live", pid, live.getFrameCase());
      }
    } catch (IOException e) {
      log.warn("The successor (pid {}) did not say it serves ({}); stopping anyway: the state is its own",
          pid, e.getMessage());
    }
  }

  /**
   * Gives up a hand-over whose state was sent: stops hearing the successor, honours a Taken it
   * queued in time (the memory is its own then), else reopens the gate (WARN) and tells it so
   * with a Refusal before the connection closes. The order is the protocol's guarantee to the
   * successor ({@link TakeOver#taken}): once input is shut, its Taken fails with EPIPE instead of
   * going unread, and the connection never closes without that Refusal first, so a successor
   * that finds it closed without one knows the running daemon is gone. (Only a successor that
   * leaves its state unread for {@link HandOver#LIVE_MILLIS} more can miss the Refusal.)
   *
   * @return the Taken that came in time, or null: this daemon serves on
   */
  private TakeOverFrame giveUp(String why) {
    try {
      channel.shutdownInput();
      // Past the deadline now: what is queued is read at once, the Refusal below may wait.
      channel.timeout(HandOver.LIVE_MILLIS);
      // Input is shut: what is queued can be read, then EOF at once; nothing more comes.
      while (true) {
        TakeOverFrame queued = channel.receiveFromTaker();
        if (queued.hasTaken()) {
          log.info("Take-over by pid {}: its Taken came as the wait ended; handing over", pid);
          return queued;
        }
      }
    } catch (IOException e) {
      // EOF after the queue, or a broken frame: no Taken came
    }
    gate.open();
    log.warn("Take-over by pid {} given up: {}; the gate is open again and this daemon serves on", pid, why);
    refuse("the running daemon gave the take-over up (" + why + ") and serves on");
    return null;
  }

  private void refuse(String reason) {
    try {
      channel.send(TakeOverFrame.newBuilder().setRefusal(Refusal.newBuilder().setReason(reason)).build());
    } catch (IOException e) {
      // the peer is gone; it learns nothing either way
    }
  }
}
