package io.gpumemd.ctl;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;
import picocli.CommandLine.MissingParameterException;
import picocli.CommandLine.Model.ArgSpec;
import picocli.CommandLine.Model.CommandSpec;
import picocli.CommandLine.Model.OptionSpec;
import picocli.CommandLine.ParameterException;
import picocli.CommandLine.ParseResult;
import picocli.CommandLine.TypeConversionException;
import picocli.CommandLine.UnmatchedArgumentException;

/**
 * Turns the errors picocli collected while parsing one command line into the project's message
 * form, one line per problem: {@code --size: '12 parsecs' (expected: …)}, {@code --keep-bytes:
 * required (e.g. --keep-bytes 64MiB)}, {@code unknown command 'frobnicate' (expected: …)}.
 * Stateless.
 */
final class UsageErrors {
  private UsageErrors() {}

  /** Every problem of the command line and of its subcommands, in the order found; empty when none. */
  static List<String> describe(ParseResult parsed) {
    Set<String> problems = new LinkedHashSet<>();
    for (ParseResult r = parsed; r != null; r = r.hasSubcommand() ? r.subcommand() : null) {
      for (Exception e : r.errors()) {
        problems.addAll(describe(e, r.commandSpec()));
      }
    }
    return new ArrayList<>(problems);
  }

  /** The long names of the options given on the command line of {@code command}. */
  static Set<String> given(ParseResult command) {
    Set<String> names = new HashSet<>();
    command.matchedOptions().forEach(option -> names.add(option.longestName()));
    return names;
  }

  /** The long names of the options whose value picocli could not convert or accept. */
  static Set<String> failed(ParseResult parsed) {
    Set<String> names = new HashSet<>();
    for (ParseResult r = parsed; r != null; r = r.hasSubcommand() ? r.subcommand() : null) {
      for (Exception e : r.errors()) {
        if (e instanceof ParameterException p && p.getArgSpec() instanceof OptionSpec option) {
          names.add(option.longestName());
        }
      }
    }
    return names;
  }

  private static List<String> describe(Exception e, CommandSpec command) {
    if (e instanceof UnmatchedArgumentException unmatched) {
      return unmatched(unmatched);
    }
    if (e instanceof MissingParameterException missing) {
      return missing(missing);
    }
    if (e instanceof ParameterException p && p.getArgSpec() != null && p.getArgSpec().isOption()
        && p.getCause() instanceof TypeConversionException conversion) {
      return List.of(GpuMemCtl.invalid(name(p.getArgSpec()), p.getValue(), conversion.getMessage()));
    }
    return List.of(e.getMessage());
  }

  private static List<String> unmatched(UnmatchedArgumentException e) {
    CommandSpec command = e.getCommandLine().getCommandSpec();
    List<String> out = new ArrayList<>();
    boolean afterUnknownFlag = false;
    for (String arg : e.getUnmatched()) {
      if (afterUnknownFlag && !arg.startsWith("-")) {
        afterUnknownFlag = false; // most likely the unknown flag's value: one problem, not two
        continue;
      }
      afterUnknownFlag = arg.startsWith("-") && !arg.contains("=");
      if (arg.startsWith("-")) {
        String flag = arg.contains("=") ? arg.substring(0, arg.indexOf('=')) : arg;
        List<String> names = new ArrayList<>();
        for (OptionSpec option : command.options()) {
          if (!option.hidden()) {
            names.add(option.longestName());
          }
        }
        out.add(flag + ": unknown flag for '" + command.qualifiedName() + "' (expected one of: "
            + String.join(", ", names) + ")");
      } else if (command.parent() == null && !command.subcommands().isEmpty()) {
        out.add("unknown command '" + arg + "' (expected one of: " + String.join(", ", command.subcommands().keySet()) + ")");
      } else {
        out.add("unexpected argument '" + arg + "' for '" + command.qualifiedName() + "'");
      }
    }
    return out;
  }

  private static List<String> missing(MissingParameterException e) {
    List<String> out = new ArrayList<>();
    // picocli reports both "option given without its value" and "required option absent" this way
    boolean valueMissing = e.getMessage().startsWith("Missing required parameter for option");
    for (ArgSpec arg : e.getMissing()) {
      String name = name(arg);
      out.add(valueMissing ? name + ": missing value"
          : name + ": required" + (arg.isOption() ? " (e.g. " + name + " " + example(arg) + ")" : ""));
    }
    return out.isEmpty() ? List.of(e.getMessage()) : out;
  }

  private static String example(ArgSpec arg) {
    return arg.paramLabel().equals("SIZE") ? "64MiB" : arg.paramLabel();
  }

  private static String name(ArgSpec arg) {
    return arg instanceof OptionSpec option ? option.longestName() : arg.paramLabel();
  }
}
