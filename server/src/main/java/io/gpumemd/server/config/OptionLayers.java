package io.gpumemd.server.config;

import io.gpumemd.server.books.Quota;
import java.io.IOException;
import java.io.Reader;
import java.nio.file.AccessDeniedException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.TreeSet;
import picocli.CommandLine;
import picocli.CommandLine.MissingParameterException;
import picocli.CommandLine.Model.ArgSpec;
import picocli.CommandLine.Model.CommandSpec;
import picocli.CommandLine.Model.OptionSpec;
import picocli.CommandLine.ParseResult;

/**
 * The layers an option's text comes from: flag &gt; environment &gt; {@code --config} file &gt;
 * default. Turns one picocli parse into {@link Settings}: each option's text with where it came
 * from, the file's per-client quotas, and a problem for each unknown flag, stray argument,
 * flag without a value, unreadable file and unknown file key. Reading the {@code --config} file
 * is the only I/O here. Stateless; thread-safe.
 */
final class OptionLayers {
  private OptionLayers() {}

  /** The settings of one parse, with the problems of the command line and the file recorded. */
  static Settings resolve(CommandSpec spec, ParseResult parsed, Map<String, String> env) {
    Settings settings = new Settings();
    commandLineProblems(parsed, settings);
    Setting configFile = layer(spec.findOption("--config"), parsed, env, new Properties(), "");
    settings.put(configFile);
    Properties file = configFile.value().isEmpty() ? new Properties() : readFile(configFile, settings);
    String fileOrigin = "file " + configFile.value();
    for (OptionSpec option : spec.options()) {
      if (!option.usageHelp() && option != spec.findOption("--config")) {
        settings.put(layer(option, parsed, env, file, fileOrigin));
      }
    }
    fileKeys(spec, file, fileOrigin, settings);
    return settings;
  }

  /** Unknown flags, stray arguments, flags without a value. */
  private static void commandLineProblems(ParseResult parsed, Settings settings) {
    List<String> unmatched = parsed.unmatched();
    for (int i = 0; i < unmatched.size(); i++) {
      String arg = unmatched.get(i);
      if (arg.startsWith("-")) {
        settings.problem("flag: '" + arg + "' (expected: one of the options listed by --help)");
        boolean takesNext = !arg.contains("=") && i + 1 < unmatched.size() && !unmatched.get(i + 1).startsWith("-");
        if (takesNext) {
          i++; // its value: one mistake, one message
        }
      } else {
        settings.problem("argument: '" + arg + "' (expected: --option value or --option=value)");
      }
    }
    for (Exception e : parsed.errors()) {
      if (e instanceof MissingParameterException missing) {
        for (ArgSpec arg : missing.getMissing()) {
          String flag = arg instanceof OptionSpec o ? o.longestName() : arg.paramLabel();
          settings.problem(flag + ": no value (expected: " + arg.paramLabel() + " after the flag)");
        }
      } else if (!(e instanceof CommandLine.UnmatchedArgumentException)) {
        settings.problem("command line: " + e.getMessage());
      }
    }
  }

  /** The file's keys that name no option, and its per-client quotas, into {@code settings}. */
  private static void fileKeys(CommandSpec spec, Properties file, String fileOrigin, Settings settings) {
    Map<String, long[]> raw = new TreeMap<>();
    for (String key : new TreeSet<>(file.stringPropertyNames())) {
      Setting s = new Setting(key, file.getProperty(key).trim(), fileOrigin);
      if (key.startsWith("quota.")) {
        quota(s, raw, settings);
      } else if (key.equals("config")) {
        settings.problem("file key: 'config' (expected: the file named by --config or GPUMEMD_CONFIG, "
            + "which cannot name another) [" + fileOrigin + "]");
      } else if (spec.findOption("--" + key) == null || spec.findOption("--" + key).usageHelp()) {
        settings.problem("file key: '" + key + "' (expected: an option listed by --help, without the dashes,"
            + " or quota.<client_name>.max-leased-bytes|max-leases) [" + fileOrigin + "]");
      }
    }
    Map<String, Quota> quotas = new TreeMap<>();
    raw.forEach((client, q) -> quotas.put(client, new Quota(q[0], q[1])));
    settings.quotas(quotas);
  }

  private static Setting layer(OptionSpec option, ParseResult parsed, Map<String, String> env, Properties file,
      String fileOrigin) {
    String name = ServerOptions.name(option);
    Setting s;
    String fromEnv = env.get(ServerOptions.envVar(name));
    String fromFile = file.getProperty(name);
    if (parsed.hasMatchedOption(option)) {
      s = new Setting(name, ((String) option.getValue()).trim(), "flag");
    } else if (fromEnv != null) {
      s = new Setting(name, fromEnv.trim(), "env " + ServerOptions.envVar(name));
    } else if (fromFile != null) {
      s = new Setting(name, fromFile.trim(), fileOrigin);
    } else {
      s = new Setting(name, option.defaultValue() == null ? "" : option.defaultValue(), "default");
    }
    option.setValue(s.value());
    return s;
  }

  private static Properties readFile(Setting path, Settings settings) {
    Properties props = new Properties();
    try (Reader reader = Files.newBufferedReader(Path.of(path.value()))) {
      props.load(reader);
    } catch (NoSuchFileException e) {
      settings.problem(path, "a readable properties file; there is no such file");
    } catch (AccessDeniedException e) {
      settings.problem(path, "a readable properties file; permission denied");
    } catch (IOException | IllegalArgumentException e) {
      settings.problem(path, "a readable properties file; " + e);
    }
    return props;
  }

  private static void quota(Setting s, Map<String, long[]> raw, Settings settings) {
    String key = s.name();
    int dot = key.lastIndexOf('.');
    String client = dot > 6 ? key.substring(6, dot) : "";
    String field = key.substring(dot + 1);
    if (client.isEmpty() || !(field.equals("max-leased-bytes") || field.equals("max-leases"))) {
      settings.problem("file key: '" + key + "' (expected: quota.<client_name>.max-leased-bytes or "
          + "quota.<client_name>.max-leases) [" + s.origin() + "]");
      return;
    }
    long[] quota = raw.computeIfAbsent(client, c -> new long[2]);
    if (field.equals("max-leased-bytes")) {
      quota[0] = settings.size(s);
    } else {
      quota[1] = settings.integer(s, 0, Long.MAX_VALUE);
    }
    settings.put(new Setting("quota." + client, "", s.origin()));
  }
}
