package io.gpumemd.server.config;

import io.gpumemd.server.session.Quota;
import java.io.IOException;
import java.io.Reader;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;

/**
 * Builds a {@link ServerConfig} from command-line flags, environment variables and an optional
 * properties file, in that order of precedence, and validates every value with a message of
 * the form {@code name: value (expected: …)}.
 *
 * <p>Every option has one name used three ways: {@code --retention-cap-bytes} on the command
 * line, {@code GPUMEMD_RETENTION_CAP_BYTES} in the environment, {@code retention-cap-bytes} in
 * the file. The file may also hold per-client quotas: {@code quota.<client>.max-leased-bytes}
 * and {@code quota.<client>.max-leases}. Stateless and thread-safe.
 */
public final class ConfigLoader {

  /** One option: its name, default, and the help line. */
  record Option(String name, String metavar, String defaultValue, String help) {
    String env() {
      return "GPUMEMD_" + name.toUpperCase(Locale.ROOT).replace('-', '_');
    }
  }

  static final List<Option> OPTIONS = List.of(
      new Option("socket", "PATH", "/tmp/gpumemd.sock", "Unix domain socket to listen on ('none' = off)"),
      new Option("listen", "HOST:PORT", "127.0.0.1:50051", "TCP address to listen on ('none' = off)"),
      new Option("backend", "auto|host|cuda", "auto", "memory backend; auto = cuda when a GPU is usable, else host"),
      new Option("metrics-port", "N", "9464", "Prometheus /metrics HTTP port (0 = off)"),
      new Option("metrics-host", "HOST", "0.0.0.0", "address the metrics endpoint binds"),
      new Option("host-devices", "N", "1", "number of simulated devices (host backend)"),
      new Option("host-device-bytes", "BYTES", "1GiB", "capacity of each simulated device (host backend)"),
      new Option("shm-dir", "DIR", "/dev/shm/gpumemd", "directory of the shared-memory segment files (host backend)"),
      new Option("shm-group", "GROUP", "", "group that may also open the segment files (default: owner only)"),
      new Option("device-limit-fraction", "F", "0.9", "device budget as a fraction of device memory"),
      new Option("device-limit-bytes", "BYTES", "0", "device budget in bytes; overrides the fraction (0 = use it)"),
      new Option("retention-cap-bytes", "BYTES", "", "cap on cached free memory per device (0 = no caching; default: the budget)"),
      new Option("max-oversize-bytes", "BYTES", "20MiB", "most a cached block may exceed a large request and still serve it"),
      new Option("unmap-wait-ms", "MS", "2000", "how long a lease may wait for clients to unmap evicted segments before RESOURCE_EXHAUSTED"),
      new Option("session-ttl-seconds", "N", "30", "TTL of sessions without keep-alive, when the client asks for none"),
      new Option("max-session-ttl-seconds", "N", "3600", "highest TTL a client may ask for"),
      new Option("keepalive-grace-ms", "MS", "2000", "how long a session outlives its closed KeepAlive stream"),
      new Option("leak-threshold-ms", "MS", "0", "warn about leases held longer than this (0 = off)"),
      new Option("quota-max-leased-bytes", "BYTES", "0", "per-session limit on leased bytes (0 = none)"),
      new Option("quota-max-leases", "N", "0", "per-session limit on live leases (0 = none)"),
      new Option("drain-timeout-ms", "MS", "10000", "on SIGTERM, how long leases may drain before memory is freed"),
      new Option("log-format", "plain|json", "plain", "log output: plain text, or one JSON object per line"),
      new Option("log-level", "LEVEL", "INFO", "log level of gpumemd's own loggers (TRACE..ERROR)"),
      new Option("config", "FILE", "", "properties file with any of these options (flags and env win)"));

  private ConfigLoader() {}

  /** True when the arguments ask for help. */
  public static boolean wantsHelp(String[] args) {
    for (String arg : args) {
      if (arg.equals("--help") || arg.equals("-h")) {
        return true;
      }
    }
    return false;
  }

  /** The {@code --help} text. */
  public static String help() {
    StringBuilder out = new StringBuilder();
    out.append("Usage: java -jar gpumemd.jar [--option value | --option=value]...\n\n")
        .append("gpumemd: a GPU memory allocator daemon. Leases pooled device memory to local\n")
        .append("processes over gRPC (Unix socket and/or TCP).\n\n")
        .append("Every option can also be set by environment variable or in the --config file.\n")
        .append("Precedence: flag > environment > file > default. Sizes accept B, KiB, MiB, GiB, TiB.\n\n");
    for (Option o : OPTIONS) {
      out.append(String.format(Locale.ROOT, "  --%-26s %s%n", o.name() + " " + o.metavar(), o.help()));
      out.append(String.format(Locale.ROOT, "    %-26s env %s%s%n", "", o.env(),
          o.defaultValue().isEmpty() ? "" : ", default " + o.defaultValue()));
    }
    out.append(String.format(Locale.ROOT, "  --%-26s %s%n", "help", "print this help and exit"));
    out.append("\nPer-client quotas (file only): quota.<client_name>.max-leased-bytes, quota.<client_name>.max-leases\n");
    return out.toString();
  }

  /** Loads from the process's arguments and environment. */
  public static ServerConfig load(String[] args) {
    return load(args, System.getenv());
  }

  /**
   * @throws ConfigException naming the first bad value
   */
  public static ServerConfig load(String[] args, Map<String, String> env) {
    Map<String, String> flags = parseFlags(args);
    Map<String, String> values = new LinkedHashMap<>();
    Map<String, String> sources = new LinkedHashMap<>();
    for (Option o : OPTIONS) {
      values.put(o.name(), o.defaultValue());
      sources.put(o.name(), "default");
    }
    String configFile = flags.getOrDefault("config", env.getOrDefault("GPUMEMD_CONFIG", ""));
    Map<String, Quota> overrides = new TreeMap<>();
    if (!configFile.isEmpty()) {
      Properties file = readFile(configFile);
      for (String key : file.stringPropertyNames()) {
        String value = file.getProperty(key).trim();
        if (key.startsWith("quota.")) {
          continue;
        }
        if (option(key) == null) {
          throw ConfigException.of("config " + configFile, "unknown option '" + key + "'",
              "one of the names listed by --help");
        }
        values.put(key, value);
        sources.put(key, "file");
      }
      overrides = quotaOverrides(file, configFile);
    }
    for (Option o : OPTIONS) {
      String fromEnv = env.get(o.env());
      if (fromEnv != null) {
        values.put(o.name(), fromEnv.trim());
        sources.put(o.name(), "env " + o.env());
      }
    }
    flags.forEach((name, value) -> {
      values.put(name, value);
      sources.put(name, "flag");
    });
    return build(values, sources, overrides);
  }

  private static Option option(String name) {
    for (Option o : OPTIONS) {
      if (o.name().equals(name)) {
        return o;
      }
    }
    return null;
  }

  private static Map<String, String> parseFlags(String[] args) {
    Map<String, String> flags = new LinkedHashMap<>();
    for (int i = 0; i < args.length; i++) {
      String arg = args[i];
      if (!arg.startsWith("--")) {
        throw ConfigException.of("argument", "'" + arg + "'", "--option value; see --help");
      }
      String name = arg.substring(2);
      String value;
      int eq = name.indexOf('=');
      if (eq >= 0) {
        value = name.substring(eq + 1);
        name = name.substring(0, eq);
      } else {
        if (i + 1 >= args.length) {
          throw ConfigException.of("--" + name, "no value", "a value after the flag");
        }
        value = args[++i];
      }
      if (option(name) == null) {
        throw ConfigException.of("flag", "--" + name, "one of the flags listed by --help");
      }
      flags.put(name, value.trim());
    }
    return flags;
  }

  private static Properties readFile(String path) {
    Properties props = new Properties();
    try (Reader reader = Files.newBufferedReader(Path.of(path))) {
      props.load(reader);
    } catch (IOException e) {
      throw ConfigException.of("config", path, "a readable properties file (" + e.getMessage() + ")");
    }
    return props;
  }

  private static Map<String, Quota> quotaOverrides(Properties file, String path) {
    Map<String, long[]> raw = new TreeMap<>();
    for (String key : file.stringPropertyNames()) {
      if (!key.startsWith("quota.")) {
        continue;
      }
      int dot = key.lastIndexOf('.');
      String client = dot > 6 ? key.substring(6, dot) : "";
      String field = key.substring(dot + 1);
      String value = file.getProperty(key).trim();
      long[] quota = raw.computeIfAbsent(client, c -> new long[2]);
      if (client.isEmpty()) {
        throw ConfigException.of(key, value, "quota.<client_name>.max-leased-bytes or .max-leases");
      } else if (field.equals("max-leased-bytes")) {
        quota[0] = nonNegative(key, Sizes.parse(key, value));
      } else if (field.equals("max-leases")) {
        quota[1] = nonNegative(key, parseLong(key, value));
      } else {
        throw ConfigException.of("config " + path, "unknown quota field '" + key + "'",
            "quota.<client_name>.max-leased-bytes or .max-leases");
      }
    }
    Map<String, Quota> out = new TreeMap<>();
    raw.forEach((client, q) -> out.put(client, new Quota(q[0], q[1])));
    return out;
  }

  private static ServerConfig build(Map<String, String> v, Map<String, String> sources, Map<String, Quota> overrides) {
    String socket = v.get("socket");
    String listen = v.get("listen");
    if (socket.equals("none")) {
      socket = "";
    }
    if (listen.equals("none")) {
      listen = "";
    }
    String listenHost = "";
    int listenPort = 0;
    if (!listen.isEmpty()) {
      int colon = listen.lastIndexOf(':');
      if (colon <= 0) {
        throw ConfigException.of("listen", listen, "HOST:PORT, e.g. 127.0.0.1:50051, or 'none'");
      }
      listenHost = listen.substring(0, colon);
      if (listenHost.startsWith("[") && listenHost.endsWith("]")) {
        listenHost = listenHost.substring(1, listenHost.length() - 1);
      }
      listenPort = (int) range("listen", listen.substring(colon + 1), 0, 65535);
    }
    if (socket.isEmpty() && listen.isEmpty()) {
      throw ConfigException.of("socket/listen", "both 'none'", "at least one listener");
    }
    String backend = v.get("backend").toLowerCase(Locale.ROOT);
    if (!List.of("auto", "host", "cuda").contains(backend)) {
      throw ConfigException.of("backend", v.get("backend"), "auto, host or cuda");
    }
    double fraction;
    try {
      fraction = Double.parseDouble(v.get("device-limit-fraction"));
    } catch (NumberFormatException e) {
      fraction = Double.NaN;
    }
    if (!(fraction > 0 && fraction <= 1)) {
      throw ConfigException.of("device-limit-fraction", v.get("device-limit-fraction"), "a number in (0, 1]");
    }
    String logFormat = v.get("log-format").toLowerCase(Locale.ROOT);
    if (!logFormat.equals("plain") && !logFormat.equals("json")) {
      throw ConfigException.of("log-format", v.get("log-format"), "plain or json");
    }
    String logLevel = v.get("log-level").toUpperCase(Locale.ROOT);
    if (!List.of("TRACE", "DEBUG", "INFO", "WARN", "ERROR").contains(logLevel)) {
      throw ConfigException.of("log-level", v.get("log-level"), "TRACE, DEBUG, INFO, WARN or ERROR");
    }
    long hostDeviceBytes = Sizes.parse("host-device-bytes", v.get("host-device-bytes"));
    if (hostDeviceBytes < (2L << 20) || hostDeviceBytes % 512 != 0) {
      throw ConfigException.of("host-device-bytes", v.get("host-device-bytes"), "at least 2MiB, a multiple of 512");
    }
    String cap = v.get("retention-cap-bytes");
    int ttl = (int) range("session-ttl-seconds", v.get("session-ttl-seconds"), 1, 86_400 * 7);
    int maxTtl = (int) range("max-session-ttl-seconds", v.get("max-session-ttl-seconds"), 1, 86_400 * 7);
    if (ttl > maxTtl) {
      throw ConfigException.of("session-ttl-seconds", ttl, "at most max-session-ttl-seconds=" + maxTtl);
    }
    return new ServerConfig(
        socket.isEmpty() ? null : Path.of(socket),
        listenHost,
        listenPort,
        backend,
        (int) range("metrics-port", v.get("metrics-port"), 0, 65535),
        v.get("metrics-host"),
        (int) range("host-devices", v.get("host-devices"), 1, 64),
        hostDeviceBytes,
        Path.of(nonEmpty("shm-dir", v.get("shm-dir"))),
        v.get("shm-group"),
        fraction,
        nonNegative("device-limit-bytes", Sizes.parse("device-limit-bytes", v.get("device-limit-bytes"))),
        cap.isEmpty() ? -1 : nonNegative("retention-cap-bytes", Sizes.parse("retention-cap-bytes", cap)),
        nonNegative("max-oversize-bytes", Sizes.parse("max-oversize-bytes", v.get("max-oversize-bytes"))),
        range("unmap-wait-ms", v.get("unmap-wait-ms"), 0, 600_000),
        ttl,
        maxTtl,
        range("keepalive-grace-ms", v.get("keepalive-grace-ms"), 0, 3_600_000),
        range("leak-threshold-ms", v.get("leak-threshold-ms"), 0, Long.MAX_VALUE / 1_000_000),
        new Quota(
            nonNegative("quota-max-leased-bytes", Sizes.parse("quota-max-leased-bytes", v.get("quota-max-leased-bytes"))),
            range("quota-max-leases", v.get("quota-max-leases"), 0, Long.MAX_VALUE)),
        Map.copyOf(overrides),
        range("drain-timeout-ms", v.get("drain-timeout-ms"), 0, 3_600_000),
        logFormat,
        logLevel,
        Map.copyOf(sources));
  }

  private static String nonEmpty(String name, String value) {
    if (value.isEmpty()) {
      throw ConfigException.of(name, "(empty)", "a path");
    }
    return value;
  }

  private static long nonNegative(String name, long value) {
    if (value < 0) {
      throw ConfigException.of(name, value, ">= 0");
    }
    return value;
  }

  private static long parseLong(String name, String text) {
    try {
      return Long.parseLong(text.trim());
    } catch (NumberFormatException e) {
      throw ConfigException.of(name, "'" + text + "'", "an integer");
    }
  }

  private static long range(String name, String text, long min, long max) {
    long value = parseLong(name, text);
    if (value < min || value > max) {
      throw ConfigException.of(name, value, "an integer in [" + min + ", " + max + "]");
    }
    return value;
  }
}
