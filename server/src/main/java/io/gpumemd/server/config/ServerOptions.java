package io.gpumemd.server.config;

import java.util.Arrays;
import java.util.Locale;
import java.util.Map;
import picocli.CommandLine;
import picocli.CommandLine.Command;
import picocli.CommandLine.Help;
import picocli.CommandLine.Help.Ansi.Text;
import picocli.CommandLine.Model.CommandSpec;
import picocli.CommandLine.Model.OptionSpec;
import picocli.CommandLine.Option;
import picocli.CommandLine.ParseResult;

/**
 * The daemon's command line, on picocli: each option is declared once below, with its flag,
 * default and help text. Its environment variable and file key follow from the flag by one
 * rule: {@code --retention-cap-bytes} is {@code GPUMEMD_RETENTION_CAP_BYTES} in the environment
 * and {@code retention-cap-bytes} in the {@code --config} properties file. The file may also
 * hold per-client quotas: {@code quota.<client_name>.max-leased-bytes} and
 * {@code quota.<client_name>.max-leases}.
 *
 * <p>{@link #parse} runs three steps: {@link OptionLayers} resolves each option through the
 * layers flag &gt; environment &gt; file &gt; default, remembering which layer gave the value;
 * {@link ServerConfig#from} builds each record of the configuration from its own options,
 * validating them; {@link HostChecks} then checks the files and the address they name. It does
 * not stop at the first problem: unknown flags, unknown file keys, every bad value and every
 * unreadable file are reported together in one {@link ConfigException}, each as
 * {@code name: 'value' (expected: …) [flag --name | env GPUMEMD_NAME | file /path]}.
 *
 * <p>A new option is declared here (its flag, default and help) and read in one record's
 * {@code from}, beside that record's component and start-log line.
 *
 * <p>The fields hold the raw text of each option once parsed (picocli's binding); the typed,
 * validated values live in {@link ServerConfig}. An instance serves one parse; the static
 * entry points are thread-safe.
 */
@Command(
    name = "gpumemd",
    customSynopsis = "java -jar gpumemd.jar [--option value | --option=value]...",
    description = {
        "",
        "gpumemd: a GPU memory allocator daemon. Leases pooled device memory to local processes",
        "over gRPC (Unix socket and/or TCP).",
        "",
        "Every option can also be set by its environment variable or, without the dashes, as a key",
        "in the --config file. Precedence: flag > environment > file > default.",
        "Sizes accept B, KiB, MiB, GiB, TiB (binary: 1KiB = 1024).",
        ""},
    optionListHeading = "Options:%n",
    footer = {
        "",
        "Per-client quotas (file only): quota.<client_name>.max-leased-bytes, quota.<client_name>.max-leases",
        "Exit codes: 0 after a clean shutdown, 1 when the daemon cannot start, 2 for a configuration error."},
    sortOptions = false,
    usageHelpWidth = 100)
public final class ServerOptions {
  static final String ENV_PREFIX = "GPUMEMD_";

  @Option(names = "--socket", paramLabel = "PATH", defaultValue = "/tmp/gpumemd.sock",
      description = "Unix domain socket to listen on ('none' = off)")
  String socket;

  @Option(names = "--listen", paramLabel = "HOST:PORT", defaultValue = "none",
      description = "TCP address to listen on ('none' = off); an address other than loopback needs "
          + "--tls-cert/--tls-key or --insecure-tcp")
  String listen;

  @Option(names = "--tls-cert", paramLabel = "FILE",
      description = "TLS on the TCP listener: its certificate chain (PEM); needs --tls-key")
  String tlsCert;

  @Option(names = "--tls-key", paramLabel = "FILE",
      description = "the private key of --tls-cert (PEM, PKCS#8, unencrypted)")
  String tlsKey;

  @Option(names = "--tls-client-ca", paramLabel = "FILE",
      description = "mutual TLS: TCP clients must present a certificate signed by this CA (PEM); "
          + "its subject CN names the tenant (cert:CN)")
  String tlsClientCa;

  @Option(names = "--admin-cert-cn", paramLabel = "NAME[,NAME...]",
      description = "client certificate CNs that may use the admin verbs (needs --tls-client-ca)")
  String adminCertCn;

  @Option(names = "--tokens-file", paramLabel = "FILE",
      description = "bearer tokens, one 'TOKEN TENANT [admin|user]' a line (# comments); a call with "
          + "'authorization: Bearer TOKEN' acts as tenant token:TENANT; reloaded when the file changes")
  String tokensFile;

  @Option(names = "--insecure-tcp", paramLabel = "true|false", arity = "0..1", fallbackValue = "true",
      defaultValue = "false",
      description = "allow a TCP listener beyond loopback without TLS, and serve unidentified TCP "
          + "peers (no token, no certificate) as one shared 'anonymous' tenant")
  String insecureTcp;

  @Option(names = "--backend", paramLabel = "auto|host|cuda", defaultValue = "auto",
      description = "memory backend; auto = cuda when a GPU is usable, else host")
  String backend;

  @Option(names = "--metrics-port", paramLabel = "N", defaultValue = "9464",
      description = "HTTP port of Prometheus /metrics and of the probes /healthz (alive) and /readyz "
          + "(ready: serving, not draining, sockets and backend in place; else 503 and why) (0 = off)")
  String metricsPort;

  @Option(names = "--metrics-host", paramLabel = "HOST", defaultValue = "127.0.0.1",
      description = "address the metrics endpoint binds (a container image or a pod binds its own "
          + "address explicitly)")
  String metricsHost;

  @Option(names = "--host-devices", paramLabel = "N", defaultValue = "1",
      description = "number of simulated devices (host backend)")
  String hostDevices;

  @Option(names = "--host-device-bytes", paramLabel = "BYTES", defaultValue = "1GiB",
      description = "capacity of each simulated device (host backend)")
  String hostDeviceBytes;

  @Option(names = "--shm-dir", paramLabel = "DIR", defaultValue = "/dev/shm/gpumemd",
      description = "directory of the shared-memory segment files (host backend)")
  String shmDir;

  @Option(names = "--shm-group", paramLabel = "GROUP",
      description = "group that may also open the segment files (default: owner only)")
  String shmGroup;

  @Option(names = "--host-segments", paramLabel = "path|fd", defaultValue = "fd",
      description = "how clients reach host segments: (fd) as file descriptors passed over the fd channel "
          + "(--fd-socket), with no file left on a path, or by the path of their file, for clients that cannot "
          + "receive descriptors (sessions of bearer-token or certificate tenants, clients without fd support); "
          + "default fd, or path where there is no fd socket (--socket none without --fd-socket)")
  String hostSegments;

  @Option(names = "--cuda-handles", paramLabel = "auto|vmm|legacy", defaultValue = "auto",
      description = "how CUDA segments reach clients: vmm (cuMemCreate, passed as file descriptors over the fd "
          + "channel; works across PID namespaces), legacy (cuMemAlloc with CUDA IPC handles; clients must share "
          + "the daemon's PID namespace, hostPID in Kubernetes), or auto (vmm where the GPU supports it and there "
          + "is an fd channel, else legacy)")
  String cudaHandles;

  @Option(names = "--fd-socket", paramLabel = "PATH",
      description = "Unix socket of the fd channel, where clients fetch segments as file descriptors with "
          + "--host-segments fd or --cuda-handles vmm; same mode and group as --socket ('none' = off; default: the --socket path "
          + "with '.fd' appended)")
  String fdSocket;

  @Option(names = "--fd-max-connections", paramLabel = "N", defaultValue = "1000",
      description = "live connections on the fd channel; more are closed at once (0 = no limit)")
  String fdMaxConnections;

  @Option(names = "--fd-max-in-flight", paramLabel = "N", defaultValue = "1024",
      description = "descriptors the fd channel has opened for replies and not yet sent, over all its "
          + "connections; beyond it requests are refused (RESOURCE_EXHAUSTED)")
  String fdMaxInFlight;

  @Option(names = "--fd-max-connections-per-tenant", paramLabel = "N", defaultValue = "100",
      description = "live fd channel connections of one tenant; its further connections are closed at once while "
          + "other tenants' go on (0 = no limit)")
  String fdMaxConnectionsPerTenant;

  @Option(names = "--fd-max-in-flight-per-tenant", paramLabel = "N", defaultValue = "128",
      description = "descriptors in flight (as --fd-max-in-flight) for the connections of one tenant; beyond it "
          + "that tenant's requests are refused (RESOURCE_EXHAUSTED) while other tenants' go on")
  String fdMaxInFlightPerTenant;

  @Option(names = "--fd-first-request-timeout-ms", paramLabel = "MS", defaultValue = "10000",
      description = "close an fd channel connection that has not sent one complete request this long after it "
          + "connected")
  String fdFirstRequestTimeoutMs;

  @Option(names = "--fd-idle-timeout-seconds", paramLabel = "N", defaultValue = "300",
      description = "close an fd channel connection that sends no complete request and is owed no reply for this "
          + "long (clients reconnect on their next fetch; 0 = never)")
  String fdIdleTimeoutSeconds;

  @Option(names = "--fd-stall-timeout-ms", paramLabel = "MS", defaultValue = "30000",
      description = "close an fd channel connection whose client reads none of the replies it is owed for this "
          + "long; the descriptors it was not sent are closed and their places in flight given back")
  String fdStallTimeoutMs;

  @Option(names = "--device-limit-fraction", paramLabel = "F", defaultValue = "0.9",
      description = "device budget as a fraction of device memory")
  String deviceLimitFraction;

  @Option(names = "--device-limit-bytes", paramLabel = "BYTES", defaultValue = "0",
      description = "device budget in bytes; overrides the fraction (0 = use it)")
  String deviceLimitBytes;

  @Option(names = "--retention-cap-bytes", paramLabel = "BYTES",
      description = "cap on cached free memory per device (0 = no caching; default: the budget)")
  String retentionCapBytes;

  @Option(names = "--max-oversize-bytes", paramLabel = "BYTES", defaultValue = "20MiB",
      description = "most a cached block may exceed a large request and still serve it")
  String maxOversizeBytes;

  @Option(names = "--unmap-wait-ms", paramLabel = "MS", defaultValue = "2000",
      description = "how long a lease may wait for clients to unmap evicted segments before RESOURCE_EXHAUSTED; "
          + "also how long a sleep waits for other sessions to release their holds on its shared blocks, and a "
          + "client asked by an admin's sleep or wake has to answer before DEADLINE_EXCEEDED")
  String unmapWaitMs;

  @Option(names = "--offload-max-bytes", paramLabel = "BYTES",
      description = "most bytes of sleeping sessions' memory and parked objects kept in host memory, all devices "
          + "together; a sleep or park beyond it is refused (default: a quarter of the machine's RAM)")
  String offloadMaxBytes;

  @Option(names = "--park-idle-objects", paramLabel = "true|false", arity = "0..1", fallbackValue = "true",
      defaultValue = "false",
      description = "before refusing a lease for lack of budget, park idle published objects (held by their names "
          + "only) in host memory, least recently looked up first; a lookup brings one back")
  String parkIdleObjects;

  @Option(names = "--session-ttl-seconds", paramLabel = "N", defaultValue = "30",
      description = "TTL of sessions without keep-alive, when the client asks for none")
  String sessionTtlSeconds;

  @Option(names = "--max-session-ttl-seconds", paramLabel = "N", defaultValue = "3600",
      description = "highest TTL a client may ask for")
  String maxSessionTtlSeconds;

  @Option(names = "--keepalive-grace-ms", paramLabel = "MS", defaultValue = "2000",
      description = "how long a session outlives its closed KeepAlive stream")
  String keepaliveGraceMs;

  @Option(names = "--leak-threshold-ms", paramLabel = "MS", defaultValue = "0",
      description = "warn about leases held longer than this (0 = off)")
  String leakThresholdMs;

  @Option(names = "--quota-max-leased-bytes", paramLabel = "BYTES", defaultValue = "0",
      description = "per-session limit on leased bytes (0 = none)")
  String quotaMaxLeasedBytes;

  @Option(names = "--quota-max-leases", paramLabel = "N", defaultValue = "0",
      description = "per-session limit on live leases (0 = none)")
  String quotaMaxLeases;

  @Option(names = "--client-cache-bytes", paramLabel = "BYTES", defaultValue = "64MiB",
      description = "client cache allowance per session: closed leases a client keeps mapped to "
          + "serve its next leases locally (0 = no client cache tier)")
  String clientCacheBytes;

  @Option(names = "--socket-mode", paramLabel = "OCTAL",
      description = "permissions of the Unix socket, e.g. 0666 for a node daemon that any local user may "
          + "call (each caller is identified by the kernel and kept to its own tenant); default: "
          + "0600, or 0660 with --shm-group")
  String socketMode;

  @Option(names = "--socket-group", paramLabel = "GROUP",
      description = "group (name or gid) of the Unix socket, for a mode such as 0660 (default: the "
          + "--shm-group, else the daemon's)")
  String socketGroup;

  @Option(names = "--tenant-by", paramLabel = "uid|gid", defaultValue = "uid",
      description = "what makes a local peer's tenant: its uid, or its primary gid (tokens and "
          + "certificates name their own tenant)")
  String tenantBy;

  @Option(names = "--admin-group", paramLabel = "GROUP",
      description = "group (name or gid) whose members may use the admin verbs, besides root and "
          + "the daemon's own uid (default: none)")
  String adminGroup;

  @Option(names = "--isolate", paramLabel = "tenant|session", defaultValue = "tenant",
      description = "who may share a segment: sessions of one tenant, or nobody (every session "
          + "gets its own segments; costs up to one 2 MiB segment per session and device)")
  String isolate;

  @Option(names = "--tenant-max-leased-bytes", paramLabel = "BYTES", defaultValue = "0",
      description = "per-tenant limit on leased bytes over all its sessions (0 = none)")
  String tenantMaxLeasedBytes;

  @Option(names = "--tenant-max-leases", paramLabel = "N", defaultValue = "0",
      description = "per-tenant limit on live leases over all its sessions (0 = none)")
  String tenantMaxLeases;

  @Option(names = "--max-sessions", paramLabel = "N", defaultValue = "10000",
      description = "live sessions in all, admins' included; more opens are RESOURCE_EXHAUSTED (0 = no limit)")
  String maxSessions;

  @Option(names = "--max-sessions-per-tenant", paramLabel = "N", defaultValue = "1000",
      description = "live sessions of one tenant (0 = no limit)")
  String maxSessionsPerTenant;

  @Option(names = "--session-open-rate", paramLabel = "N", defaultValue = "100",
      description = "session opens per second per tenant, with bursts of as many (0 = no limit)")
  String sessionOpenRate;

  @Option(names = "--max-published-bytes", paramLabel = "BYTES", defaultValue = "",
      description = "bytes of published objects per device (they outlive their sessions; default: the device budget)")
  String maxPublishedBytes;

  @Option(names = "--share-max-seconds", paramLabel = "N", defaultValue = "86400",
      description = "longest life of a share token (a token holds its block while valid; default life 300 s)")
  String shareMaxSeconds;

  @Option(names = "--max-holds-per-session", paramLabel = "N", defaultValue = "4096",
      description = "holds one session may take on shared blocks by Attach and Lookup (0 = no limit)")
  String maxHoldsPerSession;

  @Option(names = "--max-holds-per-tenant", paramLabel = "N", defaultValue = "16384",
      description = "holds all sessions of one tenant may take on shared blocks (0 = no limit); the default, four "
          + "sessions' worth, keeps a tenant's holds to about 8 MiB of heap (~0.5 KB each), where "
          + "--max-holds-per-session times --max-sessions-per-tenant would allow 2 GB")
  String maxHoldsPerTenant;

  @Option(names = "--max-shares-per-tenant", paramLabel = "N", defaultValue = "4096",
      description = "live share tokens plus published names of one tenant (0 = no limit)")
  String maxSharesPerTenant;

  @Option(names = "--max-message-bytes", paramLabel = "BYTES", defaultValue = "1MiB",
      description = "largest gRPC message a client may send (the largest a client sends is about 420 KB)")
  String maxMessageBytes;

  @Option(names = "--max-calls-per-connection", paramLabel = "N", defaultValue = "1000",
      description = "concurrent calls (HTTP/2 streams) on one connection")
  String maxCallsPerConnection;

  @Option(names = "--connection-idle-timeout-seconds", paramLabel = "N", defaultValue = "300",
      description = "close connections without calls for this long (clients reconnect; 0 = never)")
  String connectionIdleTimeoutSeconds;

  @Option(names = "--tcp-max-connections", paramLabel = "N", defaultValue = "1000",
      description = "live connections on the TCP listener; more are closed at once (0 = no limit)")
  String tcpMaxConnections;

  @Option(names = "--unix-max-connections", paramLabel = "N", defaultValue = "1000",
      description = "live connections on the Unix socket, counted apart from TCP (0 = no limit)")
  String unixMaxConnections;

  @Option(names = "--stream-stall-timeout-ms", paramLabel = "MS", defaultValue = "30000",
      description = "close a KeepAlive stream whose client reads none of its replies for this long (its session "
          + "then ends after --keepalive-grace-ms unless the client reconnects)")
  String streamStallTimeoutMs;

  @Option(names = "--drain-timeout-ms", paramLabel = "MS", defaultValue = "10000",
      description = "on SIGTERM, how long leases may drain before memory is freed")
  String drainTimeoutMs;

  @Option(names = "--take-over", paramLabel = "true|false", arity = "0..1", fallbackValue = "true",
      defaultValue = "false",
      description = "at start, take over the sessions, leases and memory of the daemon serving --socket (it must "
          + "run as the same uid), which then stops; its clients carry on with this daemon. Without such a daemon, "
          + "start fresh")
  String takeOver;

  @Option(names = "--take-over-socket", paramLabel = "PATH",
      description = "Unix socket where a successor started with --take-over asks this daemon for its state; only "
          + "this daemon's uid may connect ('none' = refuse take-overs; default: the --socket path with "
          + "'.takeover' appended)")
  String takeOverSocket;

  @Option(names = "--after-hand-over", paramLabel = "exit|wait", defaultValue = "exit",
      description = "once a successor has taken over: exit with status 0, or wait, serving nothing and not ready, "
          + "until SIGTERM (for a pod whose container would otherwise be restarted)")
  String afterHandOver;

  @Option(names = "--log-format", paramLabel = "plain|json", defaultValue = "plain",
      description = "log output: plain text, or one JSON object per line")
  String logFormat;

  @Option(names = "--log-level", paramLabel = "LEVEL", defaultValue = "INFO",
      description = "log level of gpumemd's own loggers (TRACE..ERROR)")
  String logLevel;

  @Option(names = "--config", paramLabel = "FILE",
      description = "properties file with any of these options (flags and environment win)")
  String config;

  @Option(names = {"-h", "--help"}, usageHelp = true, description = "print this help and exit")
  boolean help;

  private ServerOptions() {}

  /** Parses the process's arguments and environment. */
  public static ServerConfig parse(String[] args) {
    return parse(args, System.getenv());
  }

  /**
   * Resolves, validates and builds the configuration.
   *
   * @param env the environment ({@code GPUMEMD_*} variables are read from it)
   * @throws ConfigException listing every problem found
   */
  public static ServerConfig parse(String[] args, Map<String, String> env) {
    CommandLine cmd = commandLine();
    ParseResult parsed = cmd.parseArgs(args);
    Settings settings = OptionLayers.resolve(cmd.getCommandSpec(), parsed, env);
    ServerConfig config = ServerConfig.from(settings);
    HostChecks.check(config, settings);
    if (!settings.problems().isEmpty()) {
      throw new ConfigException(settings.problems());
    }
    return config;
  }

  /** True when the arguments ask for {@code --help} (which wins over any error in them). */
  public static boolean helpRequested(String[] args) {
    return commandLine().parseArgs(args).isUsageHelpRequested();
  }

  /** The {@code --help} text, generated by picocli. */
  public static String usage() {
    return commandLine().getUsageMessage(Help.Ansi.OFF);
  }

  /** {@code GPUMEMD_RETENTION_CAP_BYTES} for {@code retention-cap-bytes}. */
  static String envVar(String name) {
    return ENV_PREFIX + name.toUpperCase(Locale.ROOT).replace('-', '_');
  }

  /** The option's name: its flag without the dashes, and its key in the file. */
  static String name(OptionSpec option) {
    return option.longestName().substring(2);
  }

  private static CommandLine commandLine() {
    CommandLine cmd = new CommandLine(new ServerOptions());
    cmd.setOverwrittenOptionsAllowed(true); // a later flag wins, as scripts that append flags expect
    cmd.getCommandSpec().parser().collectErrors(true);
    cmd.setUsageHelpLongOptionsMaxWidth(36); // room for --max-session-ttl-seconds=N
    cmd.setHelpFactory(ServerOptions::help);
    return cmd;
  }

  /** picocli's help, with a line under each option naming its environment variable and default. */
  private static Help help(CommandSpec spec, Help.ColorScheme colors) {
    return new Help(spec, colors) {
      @Override
      public Help.IOptionRenderer createDefaultOptionRenderer() {
        Help.IOptionRenderer standard = super.createDefaultOptionRenderer();
        return (option, labels, scheme) -> {
          Text[][] rows = standard.render(option, labels, scheme);
          if (option.usageHelp()) {
            return rows;
          }
          Text[] extra = new Text[rows[0].length];
          Arrays.fill(extra, scheme.text(""));
          String fallback = option.defaultValue();
          extra[extra.length - 1] = scheme.text("env " + envVar(name(option))
              + (fallback == null || fallback.isEmpty() ? "" : ", default " + fallback));
          Text[][] out = Arrays.copyOf(rows, rows.length + 1);
          out[rows.length] = extra;
          return out;
        };
      }
    };
  }
}
