package io.gpumemd.server;

import io.grpc.Status;
import io.grpc.StatusException;
import io.grpc.StatusRuntimeException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogManager;
import java.util.logging.LogRecord;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.slf4j.spi.LoggingEventBuilder;

/**
 * Sends what gRPC and its shaded Netty write to {@code java.util.logging} through SLF4J, so it
 * comes out in the configured format (plain or JSON) at the configured levels, instead of as
 * JUL's two-line records and stack traces on stderr.
 *
 * <p>A request the transport refused (gRPC's {@code NettyServerStream} logs "Exception processing
 * message" with the status, e.g. a message over {@code --max-message-bytes}) is the peer's
 * doing, not the daemon's: it becomes one WARN line naming the status, without a stack trace,
 * and at most {@link #REFUSALS_PER_MINUTE} such lines a minute (the next one says how many were
 * left out), because a peer can send such requests as fast as it likes.
 *
 * <p>A stream the peer ended under the transport's feet (grpc-netty's "Stream Error", logged at
 * WARN with a stack trace for every cancelled stream) is expected of clients that disconnect:
 * it becomes one DEBUG line.
 *
 * <p>Installed once per JVM; thread-safe.
 */
final class JulBridge extends Handler {
  static final int REFUSALS_PER_MINUTE = 10;
  private static final long MINUTE = TimeUnit.MINUTES.toNanos(1);
  private static volatile boolean installed;

  private final AtomicLong windowStart = new AtomicLong(System.nanoTime());
  private final AtomicLong inWindow = new AtomicLong();
  private final AtomicLong suppressed = new AtomicLong();

  JulBridge() {}

  /** Replaces JUL's console output by this bridge; later calls do nothing. */
  static synchronized void install() {
    if (installed) {
      return;
    }
    java.util.logging.Logger root = LogManager.getLogManager().getLogger("");
    for (Handler h : root.getHandlers()) {
      root.removeHandler(h);
    }
    // Below WARNING, gRPC's JUL records are transport chatter; don't even build them.
    root.setLevel(Level.WARNING);
    root.addHandler(new JulBridge());
    installed = true;
  }

  @Override
  public void publish(LogRecord record) {
    if (record == null) {
      return;
    }
    Logger log = LoggerFactory.getLogger(record.getLoggerName() == null ? "jul" : record.getLoggerName());
    int level = record.getLevel().intValue();
    String message = record.getMessage() == null ? "" : record.getMessage();
    if (record.getParameters() != null && record.getParameters().length > 0) {
      try {
        message = java.text.MessageFormat.format(message, record.getParameters());
      } catch (IllegalArgumentException e) {
        // keep the pattern as it is
      }
    }
    if (isStreamReset(record, message)) {
      // A client that goes away mid-stream (cancels, is killed, is cut off for not reading) is
      // routine: one line at DEBUG, without the transport's stack trace.
      if (log.isDebugEnabled()) {
        log.debug("Stream ended by the peer or the transport: {}", String.valueOf(record.getThrown()));
      }
      return;
    }
    Status refusal = statusOf(record.getThrown());
    if (refusal != null) {
      if (!log.isWarnEnabled() || !takeRefusalLine()) {
        return;
      }
      long left = suppressed.getAndSet(0);
      log.atWarn().addKeyValue("status", refusal.getCode().name())
          .log("Request refused by the transport: {}: {}{}", message, describe(refusal),
          left > 0 ? " (" + left + " similar line(s) left out in the last minute)" : "");
      return;
    }
    LoggingEventBuilder event = level >= Level.SEVERE.intValue() ? log.atError()
        : level >= Level.WARNING.intValue() ? log.atWarn()
        : level >= Level.INFO.intValue() ? log.atInfo()
        : level >= Level.FINE.intValue() ? log.atDebug() : log.atTrace();
    if (record.getThrown() != null) {
      event = event.setCause(record.getThrown());
    }
    event.log(message);
  }

  /** grpc-netty's "Stream Error" WARN: an HTTP/2 stream reset or written after it closed. */
  private static boolean isStreamReset(LogRecord record, String message) {
    return "Stream Error".equals(message) && record.getLoggerName() != null
        && record.getLoggerName().endsWith(".NettyServerHandler");
  }

  private boolean takeRefusalLine() {
    long now = System.nanoTime();
    long start = windowStart.get();
    if (now - start >= MINUTE && windowStart.compareAndSet(start, now)) {
      inWindow.set(0);
    }
    if (inWindow.incrementAndGet() <= REFUSALS_PER_MINUTE) {
      return true;
    }
    suppressed.incrementAndGet();
    return false;
  }

  private static Status statusOf(Throwable thrown) {
    if (thrown instanceof StatusRuntimeException e) {
      return e.getStatus();
    }
    if (thrown instanceof StatusException e) {
      return e.getStatus();
    }
    return null;
  }

  private static String describe(Status status) {
    String description = status.getDescription() == null ? "" : status.getDescription();
    return status.getCode() + (description.isEmpty() ? "" : ": " + description)
        + (description.contains("exceeds maximum size") ? " (the limit is --max-message-bytes)" : "");
  }

  @Override
  public void flush() {}

  @Override
  public void close() {}
}
