package io.gpumemd.server;

import com.sun.management.HotSpotDiagnosticMXBean;
import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.config.ConfigException;
import io.gpumemd.server.config.ServerConfig;
import io.gpumemd.server.config.ServerOptions;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import sun.misc.Signal;

/**
 * {@code java -jar gpumemd.jar [flags]}: parses the configuration ({@link ServerOptions}), starts
 * the daemon, and turns SIGTERM/SIGINT into a graceful drain (a second signal forces it). Exit
 * codes: 0 after a clean shutdown (and after {@code --help}), 1 when the daemon cannot start, 2
 * for a configuration error, with every bad value named in one message, 3 on OutOfMemoryError
 * (so that a supervisor restarts it; see {@link Housekeeping}).
 */
public final class Main {
  private Main() {}

  public static void main(String[] args) {
    if (ServerOptions.helpRequested(args)) {
      System.out.print(ServerOptions.usage());
      return;
    }
    ServerConfig config;
    try {
      config = ServerOptions.parse(args, System.getenv());
    } catch (ConfigException e) {
      System.err.println("gpumemd: " + e.getMessage());
      System.err.println("Run with --help for the options.");
      System.exit(2);
      return;
    }
    // Logging is configured before the first logger exists.
    System.setProperty("gpumemd.log.level", config.logging().level());
    if (config.logging().format().equals("json")) {
      System.setProperty("logback.configurationFile", "logback-json.xml");
    }
    Logger log = LoggerFactory.getLogger(Main.class);
    log.info("gpumemd starting (pid {}, Java {}); configuration:{}", ProcessHandle.current().pid(),
        Runtime.version(), config.describe());
    Thread.setDefaultUncaughtExceptionHandler((thread, e) -> {
      if (e instanceof OutOfMemoryError oom) {
        Housekeeping.outOfMemory(thread.getName(), oom);
      }
      log.error("Uncaught exception in thread {}", thread.getName(), e);
    });
    if (!exitsOnOutOfMemory()) {
      log.warn("The JVM runs without -XX:+ExitOnOutOfMemoryError: an OutOfMemoryError in a transport thread "
          + "would leave a daemon that no longer serves; add the flag (the container image has it)");
    }

    GpumemdServer server;
    try {
      server = GpumemdServer.start(config);
    } catch (BackendException | IOException e) {
      // the message names the value and what was expected; a stack trace would bury it
      log.error("gpumemd cannot start: {}", e.getMessage());
      System.exit(1);
      return;
    } catch (RuntimeException | Error e) {
      // anything else: logged before the exit, with its cause, rather than lost to stderr or a
      // JVM kept alive by the threads already started
      log.error("gpumemd cannot start", e);
      System.exit(1);
      return;
    }

    Runnable onSignal = new Runnable() {
      private int signals;

      @Override
      public synchronized void run() {
        signals++;
        if (signals == 1) {
          Thread t = new Thread(() -> server.shutdown(false), "gpumemd-shutdown");
          t.start();
        } else {
          log.warn("Second signal: skipping the drain");
          new Thread(() -> server.shutdown(true), "gpumemd-force").start();
        }
      }
    };
    Signal.handle(new Signal("TERM"), s -> onSignal.run());
    Signal.handle(new Signal("INT"), s -> onSignal.run());
    server.awaitTermination();
    System.exit(0);
  }

  /** Whether the JVM runs with -XX:+ExitOnOutOfMemoryError (false if it cannot tell). */
  private static boolean exitsOnOutOfMemory() {
    try {
      return Boolean.parseBoolean(ManagementFactory.getPlatformMXBean(HotSpotDiagnosticMXBean.class)
          .getVMOption("ExitOnOutOfMemoryError").getValue());
    } catch (RuntimeException e) {
      return false;
    }
  }
}
