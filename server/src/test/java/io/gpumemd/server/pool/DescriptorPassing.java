package io.gpumemd.server.pool;

import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.backend.SegmentMemory;
import io.grpc.netty.shaded.io.netty.channel.epoll.Epoll;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import io.grpc.netty.shaded.io.netty.channel.unix.Socket;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * A {@link SegmentFdSink} sink for take-over tests that does what the take-over socket
 * does: each descriptor is sent with {@code SCM_RIGHTS} over a real Unix socket and closed, and
 * the number the kernel gives the receiving end is kept ({@link #received}): a raw descriptor no
 * Java object owns, as a successor daemon receives it. Both ends are in this process; the
 * numbers differ from the sent ones. Not thread-safe.
 */
public final class DescriptorPassing implements SegmentFdSink, AutoCloseable {
  private static final long DEADLINE_NANOS = 10_000_000_000L;

  private final Socket listener;
  private final Socket sender;
  private final Socket receiver;
  private final List<Integer> received = new ArrayList<>();

  public DescriptorPassing(Path socketPath) throws IOException {
    Epoll.ensureAvailability();
    listener = Socket.newSocketDomain();
    listener.bind(new DomainSocketAddress(socketPath.toString()));
    listener.listen(1);
    receiver = Socket.newSocketDomain();
    receiver.connect(new DomainSocketAddress(socketPath.toString()));
    long deadline = System.nanoTime() + DEADLINE_NANOS;
    int accepted;
    while ((accepted = listener.accept(new byte[64])) < 0) {
      pause(deadline);
    }
    sender = new Socket(accepted);
  }

  /** Sends {@code descriptor} (and closes it); its index among those sent. */
  public int add(SegmentFd descriptor) {
    return add(null, descriptor);
  }

  @Override
  public int add(SegmentMemory memory, SegmentFd descriptor) {
    try (descriptor) {
      long deadline = System.nanoTime() + DEADLINE_NANOS;
      while (sender.sendFd(descriptor.number()) <= 0) {
        pause(deadline);
      }
      int fd;
      while ((fd = receiver.recvFd()) == 0) {
        pause(deadline);
      }
      if (fd < 0) {
        throw new IOException("no descriptor came through");
      }
      received.add(fd);
      return received.size() - 1;
    } catch (IOException e) {
      throw new AssertionError(e);
    }
  }

  /** The received numbers, by index. */
  public int[] received() {
    return received.stream().mapToInt(Integer::intValue).toArray();
  }

  private static void pause(long deadline) throws IOException {
    if (System.nanoTime() > deadline) {
      throw new IOException("descriptor passing stalled");
    }
    Thread.onSpinWait();
  }

  @Override
  public void close() throws IOException {
    sender.close();
    receiver.close();
    listener.close();
  }
}
