package io.gpumemd.it.deploy;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import org.yaml.snakeyaml.LoaderOptions;
import org.yaml.snakeyaml.Yaml;
import org.yaml.snakeyaml.constructor.SafeConstructor;

/**
 * A Dockerfile split into stages and instructions, enough to check what the image claims:
 * comment lines dropped, line continuations joined, exec-form arguments ({@code ["a", "b"]})
 * parsed as JSON arrays. Not a full BuildKit parser (no heredocs, no escape directive).
 */
final class ParsedDockerfile {

  /** One instruction: its upper-case keyword and the rest of the (joined) line. */
  record Instruction(String keyword, String args) {
    /** Exec-form arguments; fails for the shell form. */
    List<String> execForm() {
      if (!args.startsWith("[")) {
        throw new AssertionError(keyword + " " + args + ": expected the exec form [\"...\"]");
      }
      return RepoFiles.strings(new Yaml(new SafeConstructor(new LoaderOptions())).load(args), keyword);
    }

    /** Words, with {@code --flag=value} options first, as COPY and FROM write them. */
    List<String> words() {
      return List.of(args.trim().split("\\s+"));
    }
  }

  /** A build stage: {@code FROM image [AS name]} and the instructions after it. */
  record Stage(String image, String name, List<Instruction> instructions) {
    List<Instruction> all(String keyword) {
      return instructions.stream().filter(i -> i.keyword().equals(keyword)).toList();
    }

    Instruction last(String keyword) {
      List<Instruction> found = all(keyword);
      if (found.isEmpty()) {
        throw new AssertionError("stage " + (name == null ? image : name) + " has no " + keyword);
      }
      return found.get(found.size() - 1);
    }

    /** ENV instructions in the {@code KEY=value ...} form, merged. */
    Map<String, String> env() {
      Map<String, String> env = new LinkedHashMap<>();
      for (Instruction i : all("ENV")) {
        for (String word : i.words()) {
          int eq = word.indexOf('=');
          if (eq <= 0) {
            throw new AssertionError("ENV " + i.args() + ": expected KEY=value pairs");
          }
          env.put(word.substring(0, eq), word.substring(eq + 1));
        }
      }
      return env;
    }
  }

  private final List<Stage> stages;

  private ParsedDockerfile(List<Stage> stages) {
    this.stages = stages;
  }

  static ParsedDockerfile parse(String text) {
    List<String> logical = new ArrayList<>();
    StringBuilder current = new StringBuilder();
    for (String line : text.split("\n", -1)) {
      String trimmed = line.trim();
      if (trimmed.startsWith("#") || (trimmed.isEmpty() && current.length() == 0)) {
        continue; // comments (and parser directives) vanish, even inside a continuation
      }
      if (trimmed.endsWith("\\")) {
        current.append(trimmed, 0, trimmed.length() - 1).append(' ');
        continue;
      }
      current.append(trimmed);
      if (current.toString().isBlank()) {
        current.setLength(0);
        continue;
      }
      logical.add(current.toString().trim());
      current.setLength(0);
    }
    if (current.length() > 0) {
      throw new AssertionError("Dockerfile ends inside a line continuation: " + current);
    }
    List<Stage> stages = new ArrayList<>();
    for (String line : logical) {
      String[] parts = line.split("\\s+", 2);
      String keyword = parts[0].toUpperCase(Locale.ROOT);
      String args = parts.length > 1 ? parts[1].trim() : "";
      if (keyword.equals("FROM")) {
        List<String> words = new ArrayList<>(List.of(args.split("\\s+")));
        words.removeIf(w -> w.startsWith("--"));
        String name = words.size() == 3 && words.get(1).equalsIgnoreCase("AS") ? words.get(2) : null;
        stages.add(new Stage(words.get(0), name, new ArrayList<>()));
      } else if (stages.isEmpty()) {
        if (!keyword.equals("ARG")) {
          throw new AssertionError(keyword + " before the first FROM");
        }
      } else {
        stages.get(stages.size() - 1).instructions().add(new Instruction(keyword, args));
      }
    }
    return new ParsedDockerfile(List.copyOf(stages));
  }

  List<Stage> stages() {
    return stages;
  }

  Stage finalStage() {
    return stages.get(stages.size() - 1);
  }

  Stage stage(String name) {
    return stages.stream().filter(s -> name.equals(s.name())).findFirst()
        .orElseThrow(() -> new AssertionError("no stage named " + name));
  }
}
