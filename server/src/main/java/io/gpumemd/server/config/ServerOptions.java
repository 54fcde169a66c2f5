package io.gpumemd.server.config;

import io.gpumemd.server.auth.BearerTokens;
import io.gpumemd.server.auth.IdentityPolicy;
import io.gpumemd.server.auth.PemFiles;
import io.gpumemd.server.auth.UnixAccounts;
import io.gpumemd.server.session.Quota;
import io.gpumemd.server.session.SessionLimits;
import io.gpumemd.server.session.SharingSettings;
import java.net.InetAddress;
import java.net.UnknownHostException;
import java.nio.file.Path;
import java.security.PrivateKey;
import java.security.cert.X509Certificate;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
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
 * <p>{@link #parse} resolves each option through the layers flag &gt; environment &gt; file &gt;
 * default, remembering which layer gave the value, then validates everything and builds the
 * {@link ServerConfig}. It does not stop at the first problem: unknown flags, unknown file keys
 * and every bad value are reported together in one {@link ConfigException}, each as
 * {@code name: 'value' (expected: …) [flag --name | env GPUMEMD_NAME | file /path]}.
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
      description = "Prometheus /metrics HTTP port (0 = off)")
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
      description = "how long a lease may wait for clients to unmap evicted segments before RESOURCE_EXHAUSTED")
  String unmapWaitMs;

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
    ServerConfig config = build(settings, settings.quotas());
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

  /** The socket's mode as rwx text; empty for the default. */
  private static String socketMode(Settings s) {
    String mode = s.text("socket-mode");
    if (mode.isEmpty()) {
      return s.text("shm-group").isEmpty() ? "rw-------" : "rw-rw----";
    }
    if (!mode.matches("0?[0-7]{3}")) {
      s.problem(s.get("socket-mode"), "an octal mode such as 0600, 0660 or 0666");
      return "rw-------";
    }
    int bits = Integer.parseInt(mode, 8);
    StringBuilder rwx = new StringBuilder();
    for (int shift = 6; shift >= 0; shift -= 3) {
      int b = (bits >> shift) & 7;
      rwx.append((b & 4) != 0 ? 'r' : '-').append((b & 2) != 0 ? 'w' : '-').append((b & 1) != 0 ? 'x' : '-');
    }
    return rwx.toString();
  }

  /** The admin group's gid; a name the group database does not know is a problem. */
  private static int adminGid(Settings s) {
    String group = s.text("admin-group");
    if (group.isEmpty()) {
      return -1;
    }
    int gid = UnixAccounts.gidOf(group);
    if (gid < 0) {
      s.problem(s.get("admin-group"), "a group name from /etc/group or a numeric gid");
    }
    return gid;
  }

  /**
   * The TLS, token and exposure settings, their files read and checked now: a wrong file is a
   * configuration error at start, never a failure at the first handshake or call.
   */
  private static TcpSecurityConfig security(Settings s, String listenHost, boolean tcp) {
    boolean insecure = s.choice("insecure-tcp", List.of("false", "true")).equals("true");
    Path cert = path(s, "tls-cert");
    Path key = path(s, "tls-key");
    Path clientCa = path(s, "tls-client-ca");
    Path tokens = path(s, "tokens-file");
    Set<String> adminCns = new TreeSet<>();
    for (String cn : s.text("admin-cert-cn").split(",")) {
      if (!cn.isBlank()) {
        adminCns.add(cn.trim());
      }
    }
    if (cert != null && key == null) {
      s.problem(s.get("tls-cert"), "a certificate with its key; --tls-key is missing");
    } else if (key != null && cert == null) {
      s.problem(s.get("tls-key"), "a key with its certificate; --tls-cert is missing");
    }
    if (clientCa != null && cert == null) {
      s.problem(s.get("tls-client-ca"), "client certificates need TLS; --tls-cert and --tls-key are missing");
    }
    if (!adminCns.isEmpty() && clientCa == null) {
      s.problem(s.get("admin-cert-cn"), "names of client certificates; without --tls-client-ca there are none");
    }
    if (cert != null && !tcp && s.valid("listen")) {
      s.problem(s.get("tls-cert"), "TLS for the TCP listener; --listen is 'none'");
    }
    if (cert != null && key != null) {
      List<X509Certificate> chain = readPem(s, "tls-cert", () -> PemFiles.certificates(cert));
      PrivateKey privateKey = readPem(s, "tls-key", () -> PemFiles.privateKey(key));
      if (chain != null && privateKey != null) {
        readPem(s, "tls-key", () -> {
          PemFiles.checkPair(chain.get(0), privateKey);
          return null;
        });
      }
    }
    if (clientCa != null) {
      readPem(s, "tls-client-ca", () -> PemFiles.certificates(clientCa));
    }
    if (tokens != null) {
      readPem(s, "tokens-file", () -> {
        BearerTokens.check(tokens);
        return null;
      });
    }
    if (tcp && cert == null && !insecure && !isLoopback(listenHost)) {
      Setting listen = s.get("listen");
      s.problem("listen: '" + listen.value() + "' is not a loopback address and has no TLS (expected: "
          + "--tls-cert and --tls-key for TLS, or --insecure-tcp to accept unidentified remote peers in "
          + "plaintext, or a loopback address such as 127.0.0.1) [" + listen.where() + "]");
    }
    return new TcpSecurityConfig(cert, key, clientCa, adminCns, tokens, insecure);
  }

  private static Path path(Settings s, String name) {
    String value = s.text(name);
    return value.isEmpty() ? null : Path.of(value);
  }

  /** Runs a file check; its failure is a problem of the named option. */
  private static <T> T readPem(Settings s, String name, java.util.function.Supplier<T> check) {
    try {
      return check.get();
    } catch (IllegalArgumentException e) {
      s.problem(s.get(name), e.getMessage());
      return null;
    }
  }

  /**
   * True when every address the host names is a loopback address: only processes of this host
   * (of this network namespace) can connect, and {@link io.gpumemd.server.auth.LoopbackPeers}
   * identifies them. A name that does not resolve counts as remote.
   */
  static boolean isLoopback(String host) {
    try {
      InetAddress[] addresses = InetAddress.getAllByName(host);
      for (InetAddress a : addresses) {
        if (!a.isLoopbackAddress()) {
          return false;
        }
      }
      return addresses.length > 0;
    } catch (UnknownHostException e) {
      return false;
    }
  }

  /** The sharing bounds; token lives from one second to a week. */
  private static SharingSettings sharing(Settings s) {
    int maxSeconds = (int) s.integer("share-max-seconds", 1, 86_400 * 7);
    return new SharingSettings(Math.min(SharingSettings.DEFAULTS.defaultShareSeconds(), Math.max(1, maxSeconds)),
        Math.max(1, maxSeconds),
        (int) s.integer("max-holds-per-session", 0, 10_000_000),
        (int) s.integer("max-shares-per-tenant", 0, 10_000_000),
        (int) s.integer("max-holds-per-tenant", 0, 10_000_000));
  }

  /** At least 64 KiB (room for any single lease or release), at most 64 MiB. */
  private static int maxMessageBytes(Settings s) {
    long bytes = s.size("max-message-bytes");
    if (s.valid("max-message-bytes") && (bytes < (64 << 10) || bytes > (64 << 20))) {
      s.problem(s.get("max-message-bytes"), "a byte size in [64KiB, 64MiB]");
      return TransportLimits.DEFAULT_MAX_MESSAGE_BYTES;
    }
    return (int) bytes;
  }

  /** Validates the settings (recording every problem) and builds the config from them. */
  private static ServerConfig build(Settings s, Map<String, Quota> quotas) {
    Setting socketSetting = s.get("socket");
    Setting listenSetting = s.get("listen");
    String socket = socketSetting.value().equals("none") ? "" : socketSetting.value();
    String listen = listenSetting.value().equals("none") ? "" : listenSetting.value();
    String listenHost = "";
    int listenPort = 0;
    if (!listen.isEmpty()) {
      int colon = listen.lastIndexOf(':');
      if (colon <= 0) {
        s.problem(listenSetting, "HOST:PORT, e.g. 127.0.0.1:50051, or 'none'");
      } else {
        listenHost = listen.substring(0, colon);
        if (listenHost.startsWith("[") && listenHost.endsWith("]")) {
          listenHost = listenHost.substring(1, listenHost.length() - 1);
        }
        try {
          listenPort = Integer.parseInt(listen.substring(colon + 1));
        } catch (NumberFormatException e) {
          listenPort = -1;
        }
        if (listenPort < 0 || listenPort > 65535) {
          s.problem(listenSetting, "HOST:PORT with a port in [0, 65535]");
          listenPort = 0;
        }
      }
    }
    TcpSecurityConfig security = security(s, listenHost, !listen.isEmpty() && s.valid("listen"));
    if (socket.isEmpty() && listen.isEmpty()) {
      s.problem("socket/listen: both 'none' (expected: at least one listener) [" + socketSetting.where() + ", "
          + listenSetting.where() + "]");
    }
    long hostDeviceBytes = s.size("host-device-bytes");
    if (s.valid("host-device-bytes") && (hostDeviceBytes < (2L << 20) || hostDeviceBytes % 512 != 0)) {
      s.problem(s.get("host-device-bytes"), "at least 2MiB, a multiple of 512");
    }
    if (s.text("shm-dir").isEmpty()) {
      s.problem(s.get("shm-dir"), "a directory path");
    }
    String cap = s.text("retention-cap-bytes");
    int ttl = (int) s.integer("session-ttl-seconds", 1, 86_400 * 7);
    int maxTtl = (int) s.integer("max-session-ttl-seconds", 1, 86_400 * 7);
    if (s.valid("session-ttl-seconds") && s.valid("max-session-ttl-seconds") && ttl > maxTtl) {
      s.problem(s.get("session-ttl-seconds"), "at most max-session-ttl-seconds=" + maxTtl);
    }
    return new ServerConfig(
        socket.isEmpty() ? null : Path.of(socket),
        listenHost,
        listenPort,
        s.choice("backend", List.of("auto", "host", "cuda")),
        (int) s.integer("metrics-port", 0, 65535),
        s.text("metrics-host"),
        (int) s.integer("host-devices", 1, 64),
        hostDeviceBytes,
        Path.of(s.text("shm-dir")),
        s.text("shm-group"),
        s.fraction("device-limit-fraction"),
        s.size("device-limit-bytes"),
        cap.isEmpty() ? -1 : s.size("retention-cap-bytes"),
        s.size("max-oversize-bytes"),
        s.integer("unmap-wait-ms", 0, 600_000),
        ttl,
        maxTtl,
        s.integer("keepalive-grace-ms", 0, 3_600_000),
        s.integer("leak-threshold-ms", 0, Long.MAX_VALUE / 1_000_000),
        new Quota(s.size("quota-max-leased-bytes"), s.integer("quota-max-leases", 0, Long.MAX_VALUE)),
        Map.copyOf(quotas),
        s.size("client-cache-bytes"),
        new TenancyConfig(
            IdentityPolicy.TenantBy.valueOf(s.choice("tenant-by", List.of("uid", "gid")).toUpperCase(Locale.ROOT)),
            s.text("admin-group"),
            adminGid(s),
            s.choice("isolate", List.of("tenant", "session")).equals("session"),
            new Quota(s.size("tenant-max-leased-bytes"), s.integer("tenant-max-leases", 0, Long.MAX_VALUE)),
            socketMode(s),
            s.text("socket-group").isEmpty() ? s.text("shm-group") : s.text("socket-group")),
        security,
        new SessionLimits(
            (int) s.integer("max-sessions", 0, 10_000_000),
            (int) s.integer("max-sessions-per-tenant", 0, 10_000_000),
            (int) s.integer("session-open-rate", 0, 1_000_000)),
        sharing(s),
        s.text("max-published-bytes").isEmpty() ? -1 : s.size("max-published-bytes"),
        new TransportLimits(
            maxMessageBytes(s),
            (int) s.integer("max-calls-per-connection", 1, 1_000_000),
            s.integer("connection-idle-timeout-seconds", 0, 86_400 * 7),
            (int) s.integer("tcp-max-connections", 0, 1_000_000),
            (int) s.integer("unix-max-connections", 0, 1_000_000),
            s.integer("stream-stall-timeout-ms", 100, 3_600_000)),
        s.integer("drain-timeout-ms", 0, 3_600_000),
        s.choice("log-format", List.of("plain", "json")),
        s.choice("log-level", List.of("TRACE", "DEBUG", "INFO", "WARN", "ERROR")),
        Map.copyOf(s.sources()));
  }
}
