package io.gpumemd.server;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import ch.qos.logback.classic.Level;
import ch.qos.logback.classic.LoggerContext;
import ch.qos.logback.classic.joran.JoranConfigurator;
import io.grpc.netty.shaded.io.netty.util.internal.logging.InternalLogger;
import io.grpc.netty.shaded.io.netty.util.internal.logging.InternalLoggerFactory;
import java.net.URL;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/** The shipped Logback configurations: which library warnings they silence, and that they still log. */
class LogbackConfigTest {
  /** Warns "Failed to find a usable hardware address…" where no interface has a MAC (containers). */
  private static final String MAC_ADDRESS_UTIL = "io.grpc.netty.shaded.io.netty.util.internal.MacAddressUtil";

  @Test
  void macAddressWarning_isSilenced_throughNettysOwnLogger() throws Exception {
    Class.forName(MAC_ADDRESS_UTIL); // the shaded class still has this name after a grpc upgrade
    // The test JVM runs on logback.xml (there is no logback-test.xml), as the daemon does.
    InternalLogger netty = InternalLoggerFactory.getInstance(MAC_ADDRESS_UTIL);
    assertFalse(netty.isWarnEnabled(), "netty's MacAddressUtil warning reaches the log via " + netty.getClass());
    assertTrue(netty.isErrorEnabled(), "errors still do");
  }

  @ParameterizedTest
  @ValueSource(strings = {"logback.xml", "logback-json.xml"})
  void eachConfiguration_silencesTheMacAddressWarning_andKeepsGpumemdAtInfo(String resource) throws Exception {
    URL url = getClass().getClassLoader().getResource(resource);
    assertNotNull(url, resource);
    LoggerContext context = new LoggerContext();
    JoranConfigurator configurator = new JoranConfigurator();
    configurator.setContext(context);
    configurator.doConfigure(url);
    try {
      assertEquals(Level.ERROR, context.getLogger(MAC_ADDRESS_UTIL).getEffectiveLevel(), resource);
      assertEquals(Level.INFO, context.getLogger("io.gpumemd.server.Main").getEffectiveLevel(), resource);
      assertEquals(Level.WARN, context.getLogger("io.grpc.netty.shaded.io.netty.channel.DefaultChannelId")
          .getEffectiveLevel(), resource + ": other netty warnings stay visible");
    } finally {
      context.stop();
    }
  }
}
