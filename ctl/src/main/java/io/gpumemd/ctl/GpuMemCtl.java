package io.gpumemd.ctl;

import io.gpumemd.client.Channels;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.grpc.StatusRuntimeException;
import java.io.IOException;
import java.io.PrintStream;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.AccessDeniedException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.Callable;
import java.util.function.Function;
import java.util.function.UnaryOperator;
import picocli.CommandLine;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;
import picocli.CommandLine.ParameterException;
import picocli.CommandLine.ParseResult;
import picocli.CommandLine.Model.CommandSpec;
import picocli.CommandLine.ScopeType;
import picocli.CommandLine.Spec;

/**
 * {@code gpumemctl}, the operator's command line for gpumemd: inspects devices, pools, leases,
 * sessions, published objects and share tokens (and removes objects, revokes tokens), trims the cache, sets the retention cap,
 * sleeps and wakes a session through its client, checks health, and runs an example
 * worker and the load generator. Admin commands open no session.
 *
 * <p>The command line is declared with picocli: this class is the top command and owns the
 * global options ({@code --target}, the TLS and token options, {@code --json}, inherited by every subcommand, so that they
 * may stand before or after the subcommand's name); each subcommand is its own
 * {@code @Command} class. Parsing collects every error rather than stopping at the first, and
 * each is reported as {@code --flag: 'value' (expected: …)} ({@link UsageErrors}).
 *
 * <p>Exit codes: 0 success (for {@code health}: SERVING), 1 the daemon answered with an error
 * or could not be reached (printed as {@code gpumemctl: CODE: message}), 2 usage error.
 *
 * <p>{@link #run} is the whole program minus process concerns, so that tests call it in-process
 * with captured streams; {@link #main} adds logging setup, signal handling and the exit code.
 * One instance per command line; not thread-safe.
 */
@Command(name = "gpumemctl",
    synopsisSubcommandLabel = "<command>",
    description = "The operator's command line for gpumemd: devices, pools, leases, sessions, published objects, "
        + "share tokens, cache control, an admin's sleep and wake of a session, health; an example worker and a "
        + "load generator.",
    footerHeading = "%n",
    footer = {
        "Sizes: 4096, 512KiB, 64MiB, 1GiB (binary suffixes).",
        "Run 'gpumemctl <command> --help' for one command's flags.",
        "Bash completion: source <(gpumemctl completion)"},
    exitCodeListHeading = "%nExit codes:%n",
    exitCodeList = {
        "0:ok (for health: SERVING)",
        "1:error from or reaching the daemon",
        "2:usage error"})
public final class GpuMemCtl implements Callable<Integer> {
  static final String DEFAULT_TARGET = "unix:///tmp/gpumemd.sock";
  static final String TARGET_ENV = "GPUMEMD_TARGET";
  static final String TLS_CA_ENV = "GPUMEMD_TLS_CA";
  static final String TLS_CERT_ENV = "GPUMEMD_TLS_CERT";
  static final String TLS_KEY_ENV = "GPUMEMD_TLS_KEY";
  static final String TOKEN_FILE_ENV = "GPUMEMD_TOKEN_FILE";

  @Option(names = "--target", paramLabel = "TARGET", scope = ScopeType.INHERIT,
      description = "the daemon: unix:///path/to.sock or host:port "
          + "(default: $" + TARGET_ENV + ", else " + DEFAULT_TARGET + ")")
  private String target;

  @Option(names = "--tls-ca", paramLabel = "FILE", scope = ScopeType.INHERIT,
      description = "TLS to a host:port target, trusting the daemon's certificate if this CA (PEM) "
          + "signed it (default: $" + TLS_CA_ENV + ")")
  private Path tlsCa;

  @Option(names = "--tls-cert", paramLabel = "FILE", scope = ScopeType.INHERIT,
      description = "client certificate (PEM) for a daemon that requires one; needs --tls-key and --tls-ca "
          + "(default: $" + TLS_CERT_ENV + ")")
  private Path tlsCert;

  @Option(names = "--tls-key", paramLabel = "FILE", scope = ScopeType.INHERIT,
      description = "the client certificate's PKCS#8 private key (PEM) (default: $" + TLS_KEY_ENV + ")")
  private Path tlsKey;

  @Option(names = "--token-file", paramLabel = "FILE", scope = ScopeType.INHERIT,
      description = "file holding a bearer token (its first line that is not blank or a # comment), sent "
          + "on every call (default: $" + TOKEN_FILE_ENV + ")")
  private Path tokenFile;

  @Option(names = "--json", scope = ScopeType.INHERIT,
      description = "machine-readable output (protobuf JSON mapping, as grpcurl prints it)")
  private boolean json;

  @Option(names = {"-h", "--help"}, usageHelp = true, scope = ScopeType.INHERIT,
      description = "show this help and exit")
  private boolean help;

  @Spec
  private CommandSpec spec;

  private final PrintStream out;
  private final PrintStream err;
  private final Function<String, String> env;
  private final boolean ownsProcess;

  private GpuMemCtl(PrintStream out, PrintStream err, Function<String, String> env, boolean ownsProcess) {
    this.out = out;
    this.err = err;
    this.env = env;
    this.ownsProcess = ownsProcess;
  }

  public static void main(String[] args) {
    // A command-line tool: warnings of the client library go to stderr, nothing else.
    System.setProperty("org.slf4j.simpleLogger.defaultLogLevel",
        System.getProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn"));
    System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
    int code = run(args, System.out, System.err, System::getenv, true);
    System.out.flush();
    System.exit(code);
  }

  /**
   * Runs one command line with the given streams and returns the exit code. Never calls
   * {@code System.exit} and installs no signal handler.
   */
  public static int run(String[] args, PrintStream out, PrintStream err) {
    return run(args, out, err, System::getenv, false);
  }

  /**
   * @param env the environment ({@code GPUMEMD_TARGET}); tests pass their own
   * @param ownsProcess true when running as {@code main}: may handle SIGTERM/SIGINT
   */
  static int run(String[] args, PrintStream out, PrintStream err, Function<String, String> env, boolean ownsProcess) {
    GpuMemCtl top = new GpuMemCtl(out, err, env, ownsProcess);
    CommandLine cli = commandLine(top);
    ParseResult parsed = cli.parseArgs(args);
    List<String> problems = UsageErrors.describe(parsed);
    if (problems.isEmpty() && CommandLine.printHelpIfRequested(parsed)) {
      return 0;
    }
    ParseResult last = parsed;
    while (last.hasSubcommand()) {
      last = last.subcommand();
    }
    Object command = last.commandSpec().userObject();
    // also after conversion errors: a value that failed to convert left its valid default, so
    // this adds only the other problems, and the operator sees every one at once
    if (command instanceof Validated validated) {
      validated.validate(new Problems(problems, UsageErrors.given(last), UsageErrors.failed(parsed)));
    }
    if (!problems.isEmpty()) {
      return top.usageError(problems, last.commandSpec().qualifiedName());
    }
    try {
      return ((Callable<?>) command).call() instanceof Integer code ? code : 0;
    } catch (ParameterException e) {
      return top.usageError(List.of(e.getMessage()), last.commandSpec().qualifiedName());
    } catch (GpuMemException e) {
      err.println("gpumemctl: " + e.code() + ": " + withTransportCause(e.serverMessage(), e.getCause(), top.target()));
      return 1;
    } catch (StatusRuntimeException e) {
      err.println("gpumemctl: " + e.getStatus().getCode() + ": " + withTransportCause(describe(e), e, top.target()));
      return 1;
    } catch (RuntimeException e) {
      throw e;
    } catch (Exception e) {
      throw new IllegalStateException(e);
    }
  }

  /** The whole command tree, with the project's converters and every error collected. */
  static CommandLine commandLine(GpuMemCtl top) {
    CommandLine cli = new CommandLine(top)
        .addSubcommand(new ListingCommands.Devices(top))
        .addSubcommand(new ListingCommands.Stats(top))
        .addSubcommand(new ListingCommands.Leases(top))
        .addSubcommand(new ListingCommands.Sessions(top))
        .addSubcommand(new CommandLine(new SharingCommands.Objects(top))
            .addSubcommand(new SharingCommands.RemoveObject(top))
            .addSubcommand(new SharingCommands.ParkObject(top)))
        .addSubcommand(new SharingCommands.Shares(top))
        .addSubcommand(new SharingCommands.RevokeShare(top))
        .addSubcommand(new PoolCommands.Trim(top))
        .addSubcommand(new PoolCommands.SetCap(top))
        .addSubcommand(new SleepCommands.Sleep(top))
        .addSubcommand(new SleepCommands.Wake(top))
        .addSubcommand(new HealthCommand(top))
        .addSubcommand(new Worker(top))
        .addSubcommand(new LoadGen(top))
        .addSubcommand(new Completion());
    // Set after the subcommands are added: these settings propagate to the commands present.
    Converters.register(cli);
    cli.getCommandSpec().parser().collectErrors(true);
    cli.getSubcommands().values().forEach(sub -> {
      sub.getCommandSpec().parser().collectErrors(true);
      sub.getSubcommands().values().forEach(nested -> nested.getCommandSpec().parser().collectErrors(true));
    });
    cli.setOut(new PrintWriter(top.out, true));
    cli.setErr(new PrintWriter(top.err, true));
    return cli;
  }

  private int usageError(List<String> problems, String command) {
    for (String problem : problems) {
      err.println("gpumemctl: " + problem);
    }
    err.println("Run '" + command + " --help' for usage.");
    return 2;
  }

  /** Without a command: a usage error (the help lists the commands). */
  @Override
  public Integer call() {
    throw new ParameterException(spec.commandLine(), "no command given (expected one of: "
        + String.join(", ", spec.subcommands().keySet()) + ")");
  }

  /** The daemon to talk to: {@code --target}, else {@code $GPUMEMD_TARGET}, else the default socket. */
  String target() {
    if (target != null) {
      return target;
    }
    String fromEnv = env.apply(TARGET_ENV);
    return fromEnv == null || fromEnv.isBlank() ? DEFAULT_TARGET : fromEnv.trim();
  }

  boolean json() {
    return json;
  }

  PrintStream out() {
    return out;
  }

  PrintStream err() {
    return err;
  }

  boolean ownsProcess() {
    return ownsProcess;
  }

  /** A path option, else its environment variable, else null. */
  private Path pathOption(Path flag, String envVar) {
    if (flag != null) {
      return flag;
    }
    String fromEnv = env.apply(envVar);
    return fromEnv == null || fromEnv.isBlank() ? null : Path.of(fromEnv.trim());
  }

  /**
   * TLS files and the bearer token from the options (or their environment variables); a file
   * that cannot be read, or a combination that makes no sense, is a usage error.
   */
  Channels.Security security() {
    Path ca = pathOption(tlsCa, TLS_CA_ENV);
    Path cert = pathOption(tlsCert, TLS_CERT_ENV);
    Path key = pathOption(tlsKey, TLS_KEY_ENV);
    Path tokens = pathOption(tokenFile, TOKEN_FILE_ENV);
    if ((cert == null) != (key == null)) {
      throw new ParameterException(spec.commandLine(), cert == null
          ? "--tls-key: '" + key + "' (expected: together with --tls-cert)"
          : "--tls-cert: '" + cert + "' (expected: together with --tls-key)");
    }
    if (cert != null && ca == null) {
      throw new ParameterException(spec.commandLine(), "--tls-cert: '" + cert
          + "' (expected: together with --tls-ca, the CA of the daemon's certificate)");
    }
    String token = tokens == null ? null : readToken(tokens);
    try {
      return new Channels.Security(ca, cert, key, token);
    } catch (IllegalArgumentException e) {
      throw new ParameterException(spec.commandLine(), "--token-file: '" + tokens + "' (expected: "
          + "a token of printable characters without blanks)");
    }
  }

  private String readToken(Path file) {
    String why;
    try {
      for (String line : Files.readAllLines(file, StandardCharsets.UTF_8)) {
        String t = line.strip();
        if (!t.isEmpty() && !t.startsWith("#")) {
          return t;
        }
      }
      why = "it holds no token";
    } catch (NoSuchFileException e) {
      why = "there is no such file";
    } catch (AccessDeniedException e) {
      why = "permission denied";
    } catch (IOException e) {
      why = String.valueOf(e.getMessage());
    }
    throw new ParameterException(spec.commandLine(), "--token-file: '" + file
        + "' (expected: a readable file holding a bearer token; " + why + ")");
  }

  /**
   * {@code --target} and the security options as flags, for the child processes of the load
   * generator: they reach the daemon as this process does.
   */
  List<String> connectionFlags() {
    List<String> flags = new ArrayList<>(List.of("--target", target()));
    Path ca = pathOption(tlsCa, TLS_CA_ENV);
    Path cert = pathOption(tlsCert, TLS_CERT_ENV);
    Path key = pathOption(tlsKey, TLS_KEY_ENV);
    Path tokens = pathOption(tokenFile, TOKEN_FILE_ENV);
    if (ca != null) {
      flags.addAll(List.of("--tls-ca", ca.toString()));
    }
    if (cert != null && key != null) {
      flags.addAll(List.of("--tls-cert", cert.toString(), "--tls-key", key.toString()));
    }
    if (tokens != null) {
      flags.addAll(List.of("--token-file", tokens.toString()));
    }
    return flags;
  }

  /** Opens a channel; a malformed target or an unreadable TLS or token file is a usage error. */
  Channels.Connection open() {
    Channels.Security security = security();
    try {
      return Channels.open(target(), security);
    } catch (IllegalArgumentException e) {
      throw new ParameterException(spec.commandLine(), "--" + e.getMessage());
    }
  }

  /** Connects a client with a session; a malformed target is a usage error. */
  GpuMemClient connect(String clientName) {
    return connect(clientName, UnaryOperator.identity());
  }

  /** Connects with builder options of the caller's (the load generator's paths). */
  GpuMemClient connect(String clientName, UnaryOperator<GpuMemClient.Builder> options) {
    try {
      Channels.Security security = security();
      GpuMemClient.Builder builder = GpuMemClient.builder(target()).clientName(clientName);
      if (security.clientCert() != null) {
        builder.tls(security.caCert(), security.clientCert(), security.clientKey());
      } else if (security.tls()) {
        builder.tls(security.caCert());
      }
      if (security.bearerToken() != null) {
        builder.bearerToken(security.bearerToken());
      }
      return options.apply(builder).connect();
    } catch (IllegalArgumentException e) {
      throw new ParameterException(spec.commandLine(), "--" + e.getMessage());
    }
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

  /** A command that checks its parsed values together (ranges, combinations) before it runs. */
  interface Validated {
    void validate(Problems problems);
  }

  /**
   * Collects a command's invalid values, one {@code --flag: 'value' (expected: …)} line each.
   * Only flags given on the command line count (a default is valid by construction, and after
   * a conversion error picocli may leave later defaults unapplied), and a flag whose value did
   * not convert is not reported twice.
   */
  static final class Problems {
    private final List<String> lines;
    private final Set<String> given;
    private final Set<String> failed;

    Problems(List<String> lines, Set<String> given, Set<String> failed) {
      this.lines = lines;
      this.given = given;
      this.failed = failed;
    }

    void add(String flag, Object value, String expected) {
      if (given.contains(flag) && !failed.contains(flag)) {
        lines.add(invalid(flag, value, expected));
      }
    }
  }

  /** Builds the {@code name: 'value' (expected: …)} message of an invalid value. */
  static String invalid(String name, Object value, String expected) {
    return name + ": '" + value + "' (expected: " + expected + ")";
  }
}
