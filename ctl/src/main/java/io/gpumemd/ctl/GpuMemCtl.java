package io.gpumemd.ctl;

import io.gpumemd.client.Channels;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.grpc.StatusRuntimeException;
import java.io.PrintStream;
import java.util.Set;

/**
 * {@code gpumemctl}, the operator's command line for gpumemd: inspects devices, pools, leases
 * and sessions, trims the cache, sets the retention cap, checks health, and runs an example
 * worker and the load generator. Admin commands open no session.
 *
 * <p>Exit codes: 0 success (for {@code health}: SERVING), 1 the daemon answered with an error
 * or could not be reached (printed as {@code gpumemctl: CODE: message}), 2 usage error.
 *
 * <p>{@link #run} is the whole program minus process concerns, so that tests call it in-process
 * with captured streams; {@link #main} adds logging setup, signal handling and the exit code.
 */
public final class GpuMemCtl {
  static final String DEFAULT_TARGET = "unix:///tmp/gpumemd.sock";
  static final Set<String> GLOBAL_FLAGS = Set.of("target", "json", "help");

  private static final String USAGE = """
      Usage: gpumemctl [--target unix:///path.sock|host:port] [--json] <command> [flags]

      Global flags:
        --target T   the daemon: unix:///path/to.sock or host:port
                     (default: $GPUMEMD_TARGET, else %s)
        --json       machine-readable output (protobuf JSON mapping, as grpcurl prints it)
        --help       this text; 'gpumemctl <command> --help' for one command

      Commands:
        devices                                    devices with backend, capacity, budget, cap
        stats    [--device N]                      pool counters and gauges per device
        leases   [--device N] [--session ID]       live leases, oldest first
                 [--limit N]                       (at most N; default 1000)
        sessions                                   live sessions with what they hold
        trim     --keep-bytes SIZE [--device N]    free cached memory down to SIZE per device
        set-cap  --cap-bytes SIZE [--device N]     set the retention cap (0 disables caching)
        health   [--service NAME]                  grpc.health.v1 check; exit 0 if SERVING, else 1
        worker   [--device N] [--size SIZE] [--hold-ms MS] [--iterations N] [--name NAME]
                                                   example worker: lease, write and verify a
                                                   pattern, hold, release; 0 iterations = forever
        loadgen  [flags]                           latency and throughput report; see
                                                   'gpumemctl loadgen --help'

      Sizes: 4096, 512KiB, 64MiB, 1GiB (binary suffixes).
      Exit codes: 0 ok, 1 error from or reaching the daemon, 2 usage error.
      """.formatted(DEFAULT_TARGET);

  private GpuMemCtl() {}

  public static void main(String[] args) {
    // A command-line tool: warnings of the client library go to stderr, nothing else.
    System.setProperty("org.slf4j.simpleLogger.defaultLogLevel",
        System.getProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn"));
    System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
    int code = run(args, System.out, System.err, true);
    System.out.flush();
    System.exit(code);
  }

  /**
   * Runs one command line with the given streams and returns the exit code. Never calls
   * {@code System.exit} and installs no signal handler.
   */
  public static int run(String[] args, PrintStream out, PrintStream err) {
    return run(args, out, err, false);
  }

  /** @param ownsProcess true when running as {@code main}: may handle SIGTERM/SIGINT */
  static int run(String[] args, PrintStream out, PrintStream err, boolean ownsProcess) {
    String target = null;
    try {
      CommandLine cli = CommandLine.parse(args);
      String command = cli.command();
      if (command == null) {
        cli.allow(GLOBAL_FLAGS);
        if (cli.has("help")) {
          out.print(USAGE);
          return 0;
        }
        throw new UsageException("no command given");
      }
      target = cli.string("target", defaultTarget());
      boolean json = cli.has("json");
      switch (command) {
        case "devices", "stats", "leases", "sessions", "trim", "set-cap", "health" -> {
          if (cli.has("help")) {
            out.print(USAGE);
            return 0;
          }
          try (AdminCommands admin = AdminCommands.connect(target, json, out)) {
            return admin.run(command, cli);
          }
        }
        case "worker" -> {
          if (cli.has("help")) {
            out.print(USAGE);
            return 0;
          }
          Worker worker = Worker.fromCommandLine(cli, target, out);
          if (ownsProcess) {
            Worker.stopOnTermination(worker);
          }
          return worker.run();
        }
        case "loadgen" -> {
          if (cli.has("help")) {
            out.print(LoadGen.USAGE);
            return 0;
          }
          return LoadGen.fromCommandLine(cli, target, out, err).run();
        }
        default -> throw new UsageException("unknown command '" + command
            + "' (expected: devices, stats, leases, sessions, trim, set-cap, health, worker or loadgen)");
      }
    } catch (UsageException e) {
      err.println("gpumemctl: " + e.getMessage());
      err.println("Run 'gpumemctl --help' for usage.");
      return 2;
    } catch (GpuMemException e) {
      err.println("gpumemctl: " + e.code() + ": " + withTransportCause(e.serverMessage(), e.getCause(), target));
      return 1;
    } catch (StatusRuntimeException e) {
      err.println("gpumemctl: " + e.getStatus().getCode() + ": " + withTransportCause(describe(e), e, target));
      return 1;
    }
  }

  /** Opens a channel; a malformed target is a usage error. */
  static Channels.Connection open(String target) {
    try {
      return Channels.open(target);
    } catch (IllegalArgumentException e) {
      throw new UsageException("--" + e.getMessage());
    }
  }

  /** Connects a client with a session; a malformed target is a usage error. */
  static GpuMemClient connect(String target, String clientName) {
    try {
      return GpuMemClient.builder(target).clientName(clientName).connect();
    } catch (IllegalArgumentException e) {
      throw new UsageException("--" + e.getMessage());
    }
  }

  private static String defaultTarget() {
    String env = System.getenv("GPUMEMD_TARGET");
    return env == null || env.isBlank() ? DEFAULT_TARGET : env.trim();
  }

  /** The server's message (the status code's name when it sent none). */
  static String describe(StatusRuntimeException e) {
    String description = e.getStatus().getDescription();
    return description == null ? e.getStatus().getCode().name() : description;
  }

  /**
   * A failure of the transport rather than of the daemon (no socket file, connection refused)
   * carries a local cause: add it and the target, which is what the operator needs to check.
   */
  private static String withTransportCause(String message, Throwable t, String target) {
    if (t instanceof StatusRuntimeException sre && sre.getStatus().getCause() != null) {
      Throwable cause = sre.getStatus().getCause();
      String detail = cause.getMessage() != null ? cause.getMessage() : cause.getClass().getSimpleName();
      return (message.contains(detail) ? message : message + ": " + detail) + " (target " + target + ")";
    }
    return message;
  }
}
