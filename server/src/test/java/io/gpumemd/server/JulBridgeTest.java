package io.gpumemd.server;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.testing.LogCapture;
import io.grpc.Status;
import java.util.List;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import org.junit.jupiter.api.Test;

/** What gRPC's JUL records become in the daemon's log. */
class JulBridgeTest {
  private static final String NETTY_HANDLER = "io.grpc.netty.shaded.io.grpc.netty.NettyServerHandler";

  private static LogRecord record(String logger, Level level, String message, Throwable thrown) {
    LogRecord r = new LogRecord(level, message);
    r.setLoggerName(logger);
    r.setThrown(thrown);
    return r;
  }

  @Test
  void aStreamTheClientReset_isOneDebugLine_withoutAStackTrace() {
    try (LogCapture log = new LogCapture(NETTY_HANDLER)) {
      ((ch.qos.logback.classic.Logger) org.slf4j.LoggerFactory.getLogger(NETTY_HANDLER))
          .setLevel(ch.qos.logback.classic.Level.DEBUG);
      new JulBridge().publish(record(NETTY_HANDLER, Level.WARNING, "Stream Error",
          new IllegalStateException("Stream closed before write could take place")));
      assertEquals(List.of(), log.messages("WARN"));
      List<String> debug = log.messages("DEBUG");
      assertEquals(1, debug.size(), debug.toString());
      assertTrue(debug.get(0).contains("Stream closed before write could take place"), debug.get(0));
      assertFalse(log.anyStackTrace());
    }
  }

  @Test
  void otherWarnings_stayWarnings_withTheirCause() {
    String logger = "io.grpc.netty.shaded.io.grpc.netty.SomethingElse";
    try (LogCapture log = new LogCapture(logger)) {
      new JulBridge().publish(record(logger, Level.WARNING, "Stream Error", new IllegalStateException("boom")));
      assertEquals(List.of("Stream Error"), log.messages("WARN"), "only grpc-netty's server handler is quietened");
      assertTrue(log.anyStackTrace());
    }
  }

  @Test
  void aTransportRefusal_isAWarningNamingTheStatus() {
    String logger = "io.grpc.netty.shaded.io.grpc.netty.NettyServerStream";
    try (LogCapture log = new LogCapture(logger)) {
      new JulBridge().publish(record(logger, Level.WARNING, "Exception processing message",
          Status.RESOURCE_EXHAUSTED.withDescription("gRPC message exceeds maximum size 1024: 2048").asRuntimeException()));
      List<String> warn = log.messages("WARN");
      assertEquals(1, warn.size(), warn.toString());
      assertTrue(warn.get(0).contains("(the limit is --max-message-bytes)"), warn.get(0));
      assertFalse(log.anyStackTrace());
    }
  }
}
